"""Lesson 1: attention over a contiguous per-request KV cache."""

from __future__ import annotations

__lesson__ = 1

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.dense import dense_causal_attention
from minisgl.kvcache.contiguous import ContiguousKVCache
from minisgl.kvcache.errors import KVCacheFullError


class ContiguousBackend(AttentionBackend):
    """Writes the new K/V at the request's offset, then attends over the valid prefix.

    Metadata (set by :meth:`prepare` before each forward): ``num_cached`` tokens are already in
    the cache; the forward brings ``num_new`` more, at positions ``num_cached .. num_cached +
    num_new - 1``. This object is also the generate loop's :class:`~minisgl.generate.SequenceKV`.
    """

    def __init__(self, cache: ContiguousKVCache) -> None:
        self.cache = cache
        self.num_cached = 0

    # --- SequenceKV -----------------------------------------------------------------------
    def prepare(self, num_cached: int, num_new: int) -> AttentionBackend:
        if num_cached + num_new > self.cache.max_seq_len:
            raise KVCacheFullError(
                f"sequence of {num_cached + num_new} tokens exceeds the cache's max_seq_len={self.cache.max_seq_len}"
            )
        self.num_cached = num_cached
        return self

    def release(self) -> None:
        """Nothing to give back: the slab belongs to this request for its whole life."""

    # --- AttentionBackend -----------------------------------------------------------------
    def store(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v [T, Hkv, D]`` into rows ``num_cached .. num_cached + T - 1``."""
        end = self.num_cached + k.shape[0]
        self.cache.k[layer_id][self.num_cached:end] = k
        self.cache.v[layer_id][self.num_cached:end] = v

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        self.store(layer_id, k, v)
        end = self.num_cached + q.shape[0]
        return dense_causal_attention(
            q, self.cache.k[layer_id][:end], self.cache.v[layer_id][:end], num_cached=self.num_cached
        )
