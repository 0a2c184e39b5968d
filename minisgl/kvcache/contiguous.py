"""Lesson 1: one request, one contiguous KV slab per layer."""

from __future__ import annotations

__lesson__ = 1

import torch

from minisgl.config import ModelConfig
from minisgl.kvcache.errors import KVCacheFullError

__all__ = ["ContiguousKVCache", "KVCacheFullError"]


class ContiguousKVCache:
    """K and V for a single request: ``k[layer], v[layer]`` are ``[max_seq_len, H_kv, D]``.

    Position ``p`` of the sequence lives in row ``p``. The whole ``max_seq_len`` is reserved up
    front, however short the request turns out to be: that waste is what lesson 2 removes.
    """

    def __init__(
        self, num_layers: int, max_seq_len: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    ) -> None:
        self.max_seq_len = max_seq_len
        shape = (max_seq_len, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @classmethod
    def for_model(cls, config: ModelConfig, max_seq_len: int, dtype: torch.dtype,
                  device: str | torch.device) -> ContiguousKVCache:
        return cls(config.num_layers, max_seq_len, config.num_kv_heads, config.head_dim, dtype, device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
