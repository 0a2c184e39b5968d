"""Lesson 2: attention over a shared token-flat pool, addressed through block tables."""

from __future__ import annotations

__lesson__ = 2

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.dense import dense_causal_attention
from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.block_table import BlockTable
from minisgl.kvcache.token_pool import TokenKVPool


class TokenPagedBackend(AttentionBackend):
    """Writes K/V through a slot mapping, reads the history through gathered KV indices.

    Metadata for one request's forward (set by :class:`PagedSequence.prepare`):

    * ``slot_mapping [T]`` int64: where the ``T`` new tokens' K/V go;
    * ``kv_indices [num_cached + T]`` int64: the slots of the whole history, in position order;
    * ``num_cached``: how many of those were cached before this forward.
    """

    def __init__(self, pool: TokenKVPool) -> None:
        self.pool = pool
        self.slot_mapping = torch.empty(0, dtype=torch.int64)
        self.kv_indices = torch.empty(0, dtype=torch.int64)
        self.num_cached = 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        self.pool.store(layer_id, self.slot_mapping, k, v)
        k_all, v_all = self.pool.gather(layer_id, self.kv_indices)  # [num_cached + T, Hkv, D]
        return dense_causal_attention(q, k_all, v_all, num_cached=self.num_cached)


class PagedSequence:
    """One request's view of the shared pool: its block table plus a backend to run with.

    Implements the generate loop's :class:`~minisgl.generate.SequenceKV`: ``prepare`` reserves
    blocks on demand (only when the sequence crosses into a new block), ``release`` returns them.
    """

    def __init__(self, pool: TokenKVPool, allocator: BlockAllocator, block_size: int) -> None:
        if allocator.num_blocks * block_size > pool.num_slots:
            raise ValueError("allocator addresses more slots than the pool has")
        self.pool, self.allocator = pool, allocator
        self.table = BlockTable(block_size)
        self.backend = TokenPagedBackend(pool)

    def prepare(self, num_cached: int, num_new: int) -> AttentionBackend:
        end = num_cached + num_new
        self.table.reserve(self.allocator, end)
        device = self.pool.k[0].device
        self.backend.kv_indices = self.table.slots(0, end, device)
        self.backend.slot_mapping = self.backend.kv_indices[num_cached:]
        self.backend.num_cached = num_cached
        return self.backend

    def release(self) -> None:
        self.table.release(self.allocator)
