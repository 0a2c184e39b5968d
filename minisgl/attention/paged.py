"""Lesson 3: the batch paged-attention interface and its torch reference implementation."""

from __future__ import annotations

__lesson__ = 3

import copy
from abc import abstractmethod

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.dense import dense_causal_attention
from minisgl.attention.metadata import BatchMetadata
from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.block_table import BlockTable
from minisgl.kvcache.paged_pool import PagedKVPool


class PagedBackend(AttentionBackend):
    """Attention over a :class:`PagedKVPool` for a whole batch described by :class:`BatchMetadata`.

    ``plan(meta)`` runs once per forward pass (per batch); ``forward`` runs once per layer:
    append the new tokens' K/V to their pages, then attend (prefill: causal over cached + new
    tokens; decode: one query per request over its whole history).

    Lesson 7: ``plan`` also *returns* the planned batch, a snapshot of the backend that owns
    that batch's metadata (index tensors, kernel plans). Planning the next batch replaces the
    backend's own state, never the snapshot's, so a batch still running on the device keeps
    reading its own plan while the host plans the next one. The engine runs the model on the
    snapshot; lesson 3's single-request driver may keep calling ``backend.forward`` after
    ``backend.plan``, which reads the latest plan.
    """

    def __init__(self, pool: PagedKVPool) -> None:
        self.pool = pool
        self.meta: BatchMetadata | None = None

    def plan(self, meta: BatchMetadata) -> PagedBackend:
        """Plan one batch; returns its own attention object (the model calls its ``forward``)."""
        self._plan(meta)  # rebinds this backend's per-batch attributes to new objects
        return copy.copy(self)  # ... so a shallow copy keeps this batch's ones

    @abstractmethod
    def _plan(self, meta: BatchMetadata) -> None:
        """Compute the per-batch state; each call must bind *new* objects (never mutate the old)."""

    def batch_enqueued(self) -> None:
        """Called on a planned batch once its forward pass is enqueued (lesson 7): a backend
        whose plans share device buffers marks them busy until the device is done."""


def attend_gathered(pool: PagedKVPool, q: torch.Tensor, gather: torch.Tensor, valid: torch.Tensor,
                    layer_id: int) -> torch.Tensor:
    """One query per row over a gathered history: ``q [B, Hq, D]``; ``gather [B, S]`` token
    slots of each row's history and ``valid [B, S]`` which of them count -> ``[B, Hq, D]``."""
    B, Hq, D = q.shape
    Hkv = pool.num_kv_heads
    k_all = pool.k[layer_id].view(-1, Hkv, D)[gather].float()  # [B, S, Hkv, D]
    v_all = pool.v[layer_id].view(-1, Hkv, D)[gather].float()
    qg = q.float().view(B, Hkv, Hq // Hkv, D)  # query heads grouped by their KV head
    scores = torch.einsum("bkgd,bskd->bkgs", qg, k_all) * (D**-0.5)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgs,bskd->bkgd", scores.softmax(dim=-1), v_all)
    return out.reshape(B, Hq, D).to(q.dtype)


class ReferencePagedBackend(PagedBackend):
    """Plain torch, one request at a time: walk the request's page list, read its pages, attend.

    Slow (a Python loop and a copy of each request's KV per layer) but obviously right: it
    defines what every faster backend must compute. Works on CPU and GPU.
    """

    def _plan(self, meta: BatchMetadata) -> None:
        self.meta = meta
        device = self.pool.device
        self._write_slots = meta.new_token_slots().to(device)
        self._qo = meta.qo_indptr.tolist()
        self._kv = meta.kv_indptr.tolist()
        self._seq_lens = meta.seq_lens.tolist()
        self._pages = meta.kv_indices.long().to(device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        assert self.meta is not None, "plan() must run before forward()"
        pool = self.pool
        pool.store(layer_id, self._write_slots, k, v)
        out = torch.empty_like(q)
        for i in range(len(self._seq_lens)):
            self._attend_row(i, q, out, layer_id)
        return out

    def _attend_row(self, i: int, q: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
        """Row ``i``: its new tokens' queries, causally over its cached and new K/V, into ``out``."""
        pool = self.pool
        H, D = pool.num_kv_heads, pool.head_dim
        seq_len = self._seq_lens[i]
        q0, q1 = self._qo[i], self._qo[i + 1]
        pages = self._pages[self._kv[i]:self._kv[i + 1]]
        k_i = pool.k[layer_id][pages].reshape(-1, H, D)[:seq_len]  # [seq_len, Hkv, D]
        v_i = pool.v[layer_id][pages].reshape(-1, H, D)[:seq_len]
        out[q0:q1] = dense_causal_attention(q[q0:q1], k_i, v_i, num_cached=seq_len - (q1 - q0))


class TorchPagedBackend(ReferencePagedBackend):
    """The reference, with single-query rows vectorised: the default on the CPU.

    A row with one new token (every row of a decode batch, the decode rows of a mixed batch in
    lesson 6, a one-token chunk) attends to its whole history. Those rows are done together:
    their histories are gathered into one padded ``[B1, S_max, Hkv, D]`` tensor (``S_max`` = the
    longest of them) and attended with a padding mask, in a handful of torch ops instead of a
    Python loop per request. Rows with several new tokens (prompts, prompt chunks) use the
    reference loop.
    """

    def _plan(self, meta: BatchMetadata) -> None:
        super()._plan(meta)
        ps = meta.page_size
        single = meta.qo_lens == 1  # [B]
        rows = single.nonzero().flatten()
        self._multi_rows = (~single).nonzero().flatten().tolist()
        self._single_q = meta.qo_indptr[:-1].long()[rows].to(self.pool.device)  # their query tokens [B1]
        if rows.numel() == 0:
            return
        seq_lens = meta.seq_lens.long()[rows]  # [B1]
        pos = torch.arange(int(seq_lens.max()))[None, :]  # [1, S_max]
        valid = pos < seq_lens[:, None]  # [B1, S_max]
        page_idx = (meta.kv_indptr[:-1].long()[rows][:, None] + pos // ps).clamp(max=meta.kv_indices.numel() - 1)
        slots = meta.kv_indices.long()[page_idx] * ps + pos % ps
        self._valid = valid.to(self.pool.device)
        self._gather = slots.masked_fill(~valid, 0).to(self.pool.device)  # [B1, S_max]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        assert self.meta is not None, "plan() must run before forward()"
        pool = self.pool
        pool.store(layer_id, self._write_slots, k, v)
        out = torch.empty_like(q)
        for i in self._multi_rows:
            self._attend_row(i, q, out, layer_id)
        if self._single_q.numel():
            out[self._single_q] = self._attend_single(q[self._single_q], layer_id)
        return out

    def _attend_single(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        """``q [B1, Hq, D]``, one query per row, over each row's whole history -> ``[B1, Hq, D]``."""
        return attend_gathered(self.pool, q, self._gather, self._valid, layer_id)


class BlockSequence:
    """One request over a shared :class:`PagedKVPool`: the generate loop's ``SequenceKV`` for lesson 3.

    Each ``prepare`` reserves pages on demand and plans the backend for a batch of one.
    """

    def __init__(self, pool: PagedKVPool, allocator: BlockAllocator, backend: PagedBackend) -> None:
        self.pool, self.allocator, self.backend = pool, allocator, backend
        self.table = BlockTable(pool.page_size)

    def prepare(self, num_cached: int, num_new: int) -> AttentionBackend:
        self.table.reserve(self.allocator, num_cached + num_new)
        self.backend.plan(BatchMetadata.from_requests([self.table.blocks], [num_cached], [num_new], self.pool.page_size))
        return self.backend

    def release(self) -> None:
        self.table.release(self.allocator)
