"""VocabParallelEmbedding.forward all-reduces its rows at once, never through ``self.tp.reduce_later``.

The rows are right, but the first layer's pre-norm step never gets a ``PendingSum``: on two
GPUs the embedding's all-reduce and the first RMSNorm stay two kernels instead of one.
"""
# first: lessons/l09/test_l09_tp.py::test_sums_left_to_the_pre_norm_step_give_hfs_tokens[qwen3]

import torch.nn.functional as F
from torch import nn


def vocab_parallel_embedding_forward(self, input_ids):
    if self.tp.size == 1:
        return nn.Embedding.forward(self, input_ids)
    local = input_ids - self.vocab_start
    mine = (local >= 0) & (local < self.shard)
    out = F.embedding(local.clamp(0, self.shard - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
    return self.tp.all_reduce(out)
