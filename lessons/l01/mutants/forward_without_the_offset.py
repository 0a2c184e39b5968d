"""forward() attends with ``num_cached=0``: the causal mask is aligned top-left.

Breaks the decode step (and any prefill after cached tokens): the new token at position p sees
only key 0 instead of keys 0..p.
"""
# first: lessons/l01/test_l01_parity.py::test_greedy_tokens_identical_to_hf

import torch

from minisgl.attention.contiguous import ContiguousBackend
from minisgl.attention.dense import dense_causal_attention


def forward(self: ContiguousBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    self.store(layer_id, k, v)
    end = self.num_cached + q.shape[0]
    return dense_causal_attention(q, self.cache.k[layer_id][:end], self.cache.v[layer_id][:end], 0)  # BUG
