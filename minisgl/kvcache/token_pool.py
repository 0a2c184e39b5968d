"""Lesson 2: a token-flat KV pool shared by every request.

Per layer, K and V are ``[num_slots, H_kv, D]``: slot ``s`` holds one token's K (and V) for
that layer. The pool knows nothing about requests; block tables map a request's positions to
slots: ``slot = block_id * block_size + offset``.
"""

from __future__ import annotations

__lesson__ = 2

import torch

from minisgl.config import ModelConfig


class TokenKVPool:
    def __init__(
        self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    ) -> None:
        self.num_slots = num_slots
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @classmethod
    def for_model(cls, config: ModelConfig, num_slots: int, dtype: torch.dtype, device: str | torch.device) -> TokenKVPool:
        return cls(config.num_layers, num_slots, config.num_kv_heads, config.head_dim, dtype, device)

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v [T, Hkv, D]`` into ``slots [T]`` (int64) of layer ``layer_id``."""
        self.k[layer_id][slots] = k
        self.v[layer_id][slots] = v

    def gather(self, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[len(slots), Hkv, D]`` of layer ``layer_id`` (a copy: gathering costs memory traffic)."""
        return self.k[layer_id][slots], self.v[layer_id][slots]
