"""Lesson 8: decode attention for CUDA graphs: every input in a static buffer.

A captured decode step replays the same kernels on the same addresses, so its attention cannot
plan a batch into fresh tensors the way lesson 3's backends do. Each backend that can run
captured decode steps gets a *graph attention* here, built over the same KV pool:

* :class:`TorchDecodeGraphAttention` for the torch backends (lesson 3's reference and its
  vectorised variant; also the Triton backend): the CPU path, and the discipline's test bed;
* :class:`FlashInferDecodeGraphAttention`, FlashInfer's decode wrappers in CUDA-graph mode;
* :class:`FusedDecodeGraphAttention`, the same with one kernel per layer for the small buckets
  (:mod:`minisgl.attention.fused_decode`: append, split-KV attention and merge together).

:func:`decode_graph_attention` picks the one that matches a backend.
"""

from __future__ import annotations

__lesson__ = 8

from abc import abstractmethod

import torch
from torch import nn

from minisgl.attention.base import AttentionBackend
from minisgl.attention.flashinfer_backend import FlashInferBackend
from minisgl.attention.fused_decode import AppendDecodeWorkspace, QKRotation, append_decode_attention
from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import PagedBackend, ReferencePagedBackend, attend_gathered
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.layers.decode_kernels import use_triton


def decode_graph_attention(backend: PagedBackend, max_bs: int, max_pages: int, buckets: list[int]) -> DecodeGraphAttention:
    """A new :class:`DecodeGraphAttention` over ``backend``'s pool for decode batches of the
    sizes in ``buckets`` (at most ``max_bs`` rows of at most ``max_pages`` pages each). Raises
    ``ValueError`` for a backend that cannot run captured decode steps."""
    if isinstance(backend, FlashInferBackend):
        if use_triton(backend.pool.k[0]):  # CUDA, 16-bit, Triton present, fused kernels allowed
            return FusedDecodeGraphAttention(backend.pool, backend.num_qo_heads, max_bs, max_pages, buckets)
        return FlashInferDecodeGraphAttention(backend.pool, backend.num_qo_heads, max_bs, max_pages, buckets)
    if isinstance(backend, ReferencePagedBackend):  # the torch backends (and Triton, which extends them)
        return TorchDecodeGraphAttention(backend.pool, max_bs, max_pages)
    raise ValueError(f"the {type(backend).__name__} attention backend cannot run captured decode steps")


class DecodeGraphAttention(AttentionBackend):
    """Lesson 8: decode attention whose every input lives in a static buffer.

    A captured decode step (a CUDA graph) records the addresses its kernels read, once. So the
    attention of a captured step may only read tensors allocated before the capture and
    rewritten in place before every replay. :meth:`prepare` (host side, before each replay or
    eager run) writes a decode batch's metadata, already padded to one of the ``buckets``, into
    those buffers; :meth:`forward` (the part that is captured) reads nothing else.
    """

    def __init__(self, pool: PagedKVPool, max_bs: int, max_pages: int) -> None:
        self.pool, self.max_bs, self.max_pages = pool, max_bs, max_pages

    def variants(self, batch_size: int) -> tuple[str, ...]:
        """The kinds of graph a bucket of ``batch_size`` rows is captured in: one (``""``)
        unless the attention has a kernel that pays only for some batches of that size."""
        return ("",)

    @abstractmethod
    def prepare(self, meta: BatchMetadata, variant: str | None = None) -> str:
        """Write the (padded) decode batch ``meta`` into the static buffers, and return which of
        the bucket's :meth:`variants` must replay it (``variant``, when given: the capture of
        each). The caller (the graph runner) has checked that it fits: one token per row, at
        most ``max_bs`` rows of at most ``max_pages`` pages."""


class TorchDecodeGraphAttention(DecodeGraphAttention):
    """The torch decode attention of :class:`TorchPagedBackend` on static buffers: the write
    slot of each row ``[max_bs]`` and, for every row, the slot and validity of each of its up
    to ``max_pages * page_size`` history positions ``[max_bs, W]``. Every row attends over the
    full static width ``W`` with a mask: shapes never depend on the batch."""

    def __init__(self, pool: PagedKVPool, max_bs: int, max_pages: int) -> None:
        super().__init__(pool, max_bs, max_pages)
        width = max_pages * pool.page_size
        dev = pool.device
        self.write_slots = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.gather = torch.zeros(max_bs, width, dtype=torch.int64, device=dev)
        self.valid = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)

    def prepare(self, meta: BatchMetadata, variant: str | None = None) -> str:
        b, ps = meta.batch_size, meta.page_size
        width = self.gather.shape[1]
        pos = torch.arange(width)[None, :]  # [1, W]
        valid = pos < meta.seq_lens.long()[:, None]  # [b, W]
        page_idx = (meta.kv_indptr[:-1].long()[:, None] + pos // ps).clamp(max=meta.kv_indices.numel() - 1)
        slots = (meta.kv_indices.long()[page_idx] * ps + pos % ps).masked_fill(~valid, 0)
        self.write_slots[:b].copy_(meta.new_token_slots())
        self.gather[:b].copy_(slots)
        self.valid[:b].copy_(valid)
        return ""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        b = q.shape[0]
        self.pool.store(layer_id, self.write_slots[:b], k, v)
        return attend_gathered(self.pool, q, self.gather[:b], self.valid[:b], layer_id)


class FlashInferDecodeGraphAttention(DecodeGraphAttention):
    """Lesson 8: FlashInfer decode in its CUDA-graph mode. One decode wrapper per bucket size,
    all of them reading the same fixed device buffers (``kv_indptr``, ``kv_indices``,
    ``last_page_len``, sized for ``max_bs`` rows of ``max_pages`` pages): ``plan`` copies a
    batch's metadata into them, and the captured ``run`` reads them at the same addresses on
    every replay. The KV append reads fixed buffers too (each row's position). Each bucket uses
    the decode kernel ``decode_uses_tensor_cores`` picks for its size."""

    def __init__(self, pool: PagedKVPool, num_qo_heads: int, max_bs: int, max_pages: int, buckets: list[int]) -> None:
        import flashinfer

        from minisgl.attention.flashinfer_backend import WORKSPACE_BYTES, PinnedInts, decode_uses_tensor_cores

        super().__init__(pool, max_bs, max_pages)
        dev, i32 = pool.device, torch.int32
        self.num_qo_heads = num_qo_heads
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=i32, device=dev)
        self.kv_indices = torch.zeros(max_bs * max_pages, dtype=i32, device=dev)
        self.last_page_len = torch.zeros(max_bs, dtype=i32, device=dev)
        self.append_rows = torch.arange(max_bs, dtype=i32, device=dev)  # row i appends one token
        self.append_pos = torch.zeros(max_bs, dtype=i32, device=dev)  # at this position
        self.pinned = PinnedInts(3 * max_bs + 1 + max_bs * max_pages)  # reused once the runner's slot is free
        self.wrappers = {
            b: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, kv_layout="NHD", use_cuda_graph=True,
                use_tensor_cores=decode_uses_tensor_cores(num_qo_heads, pool.num_kv_heads, b),
                paged_kv_indptr_buffer=self.kv_indptr[: b + 1],
                paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.last_page_len[:b])
            for b in buckets
        }

    def prepare(self, meta: BatchMetadata, variant: str | None = None) -> str:
        b = meta.batch_size
        kv_indptr, kv_indices, last_page_len, positions = self.pinned.stage(
            [meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, meta.seq_lens - 1])
        self.wrappers[b].plan(  # copies indptr, indices and last_page_len into the fixed buffers
            kv_indptr, kv_indices.to(self.pool.device, non_blocking=True), last_page_len,
            num_qo_heads=self.num_qo_heads, num_kv_heads=self.pool.num_kv_heads, head_dim=self.pool.head_dim,
            page_size=meta.page_size, pos_encoding_mode="NONE", q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
        )
        self.append_pos[:b].copy_(positions, non_blocking=True)
        return ""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        import flashinfer

        b = q.shape[0]
        cache = (self.pool.k[layer_id], self.pool.v[layer_id])
        flashinfer.page.append_paged_kv_cache(
            k, v, self.append_rows[:b], self.append_pos[:b], cache,
            self.kv_indices, self.kv_indptr[: b + 1], self.last_page_len[:b], kv_layout="NHD",
        )
        return self.wrappers[b].run(q, cache)


class FusedDecodeGraphAttention(FlashInferDecodeGraphAttention):
    """FlashInfer's captured decode, plus, for buckets of at most ``FUSED_DECODE_MAX_BS`` rows,
    a second graph per bucket with :func:`~minisgl.attention.fused_decode.append_decode_attention`:
    one kernel per layer instead of three (append, decode, merge), reading the same fixed
    ``kv_indptr`` / ``kv_indices`` / ``last_page_len`` buffers. A batch replays that one when no
    row is longer than ``FUSED_DECODE_MAX_CONTEXT`` tokens, where the fused kernel is faster;
    then :meth:`prepare` only copies the batch's metadata (FlashInfer's ``plan`` does more host
    work than that). Longer contexts replay FlashInfer's graph, whose kernels stream long
    contexts faster."""

    # `python -m benchmarks kernels` (decode_kernels_h200.json), per layer of both shapes: the
    # fused kernel wins at 128 and 512 tokens for 1, 2 and 4 rows (6.9 against 11.8 us at bs=1
    # and 128 tokens), at 8 rows only at 128, and loses from 2048 tokens on. 1024, between the
    # two, was not measured.
    FUSED_DECODE_MAX_BS = 4
    FUSED_DECODE_MAX_CONTEXT = 1024

    def __init__(self, pool: PagedKVPool, num_qo_heads: int, max_bs: int, max_pages: int, buckets: list[int]) -> None:
        super().__init__(pool, num_qo_heads, max_bs, max_pages, buckets)
        fused_max = max([b for b in buckets if b <= self.FUSED_DECODE_MAX_BS], default=0)
        self.workspace_fused = AppendDecodeWorkspace(
            fused_max, num_qo_heads, pool.num_kv_heads, pool.head_dim, pool.device) if fused_max else None
        self.fused = False  # which kernel the prepared batch runs

    def variants(self, batch_size: int) -> tuple[str, ...]:
        return ("", "fused") if batch_size <= self.FUSED_DECODE_MAX_BS else ("",)

    def prepare(self, meta: BatchMetadata, variant: str | None = None) -> str:
        b = meta.batch_size
        if variant is None:
            short = b <= self.FUSED_DECODE_MAX_BS and int(meta.seq_lens.max()) <= self.FUSED_DECODE_MAX_CONTEXT
            variant = "fused" if short else ""
        self.fused = variant == "fused"
        if not self.fused:
            return super().prepare(meta)
        kv_indptr, kv_indices, last_page_len = self.pinned.stage([meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len])
        self.kv_indptr[: b + 1].copy_(kv_indptr, non_blocking=True)
        self.kv_indices[: kv_indices.numel()].copy_(kv_indices, non_blocking=True)
        self.last_page_len[:b].copy_(last_page_len, non_blocking=True)
        return variant

    @property
    def rotates_qk(self) -> bool:
        """The fused graphs apply RoPE (and Qwen3's q/k norms) inside the attention kernel."""
        return self.fused

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        if not self.fused:
            return super().forward(q, k, v, layer_id)
        return self._fused(q, k, v, layer_id)

    def forward_rotating(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                         positions: torch.Tensor, rotary: nn.Module, q_norm: nn.Module | None,
                         k_norm: nn.Module | None) -> torch.Tensor:
        if not self.fused:
            return super().forward_rotating(q, k, v, layer_id, positions, rotary, q_norm, k_norm)
        rotation = QKRotation(positions, rotary.cos_sin_cache(), q_norm.weight if q_norm is not None else None,
                              k_norm.weight if k_norm is not None else None, q_norm.eps if q_norm is not None else 0.0)
        return self._fused(q, k, v, layer_id, rotation)

    def _fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
               rotation: QKRotation | None = None) -> torch.Tensor:
        b = q.shape[0]
        return append_decode_attention(q, k, v, self.pool.k[layer_id], self.pool.v[layer_id], self.kv_indptr[: b + 1],
                                       self.kv_indices, self.last_page_len[:b], self.workspace_fused,
                                       rotation=rotation)
