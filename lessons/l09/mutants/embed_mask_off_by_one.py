"""VocabParallelEmbedding.forward keeps ids with ``local <= self.shard`` (one past its last row) as its own.

Breaks "exactly one rank contributes each row": the first id of the next rank also gets this
rank's last row (clamped), so that id's embedding is the sum of two rows.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

import torch.nn.functional as F
from torch import nn


def vocab_parallel_embedding_forward(self, input_ids):
    if self.tp.size == 1:
        return nn.Embedding.forward(self, input_ids)
    local = input_ids - self.vocab_start
    mine = (local >= 0) & (local <= self.shard)
    out = F.embedding(local.clamp(0, self.shard - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
    return self.tp.reduce_later(out)
