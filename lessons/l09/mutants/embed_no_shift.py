"""VocabParallelEmbedding.forward looks up ``input_ids`` as they are, not shifted by ``self.vocab_start``.

Breaks the lookup on every rank but 0: rank 1 owns ids from ``vocab_start`` on, but looks up
rows by the whole vocabulary's numbering, so those ids get zeros or another id's row.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

import torch.nn.functional as F
from torch import nn


def vocab_parallel_embedding_forward(self, input_ids):
    if self.tp.size == 1:
        return nn.Embedding.forward(self, input_ids)
    local = input_ids
    mine = (local >= 0) & (local < self.shard)
    out = F.embedding(local.clamp(0, self.shard - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
    return self.tp.reduce_later(out)
