"""store() writes the new K and V starting at row ``num_cached + 1``.

Breaks "position p lives in row p": every token's K/V sits one row late, attention reads a row
that was never written and misses the newest token.
"""
# first: lessons/l01/test_l01_parity.py::test_greedy_tokens_identical_to_hf

import torch

from minisgl.attention.contiguous import ContiguousBackend


def store(self: ContiguousBackend, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
    start = self.num_cached + 1  # BUG: one row too far
    self.cache.k[layer_id][start:start + k.shape[0]] = k
    self.cache.v[layer_id][start:start + v.shape[0]] = v
