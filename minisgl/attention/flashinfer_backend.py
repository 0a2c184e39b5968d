"""Lesson 3: FlashInfer's paged attention kernels (CUDA only; FlashInfer is imported lazily).

FlashInfer splits each kernel call in two: ``plan`` looks at the batch shape (how many queries
and pages per request) on the CPU and decides how to split the work across thread blocks;
``run`` launches the kernel. A batch is planned once and then run for every layer, because all
layers of one forward pass see the same batch shape.
"""

from __future__ import annotations

import torch

from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import PagedBackend
from minisgl.kvcache.paged_pool import PagedKVPool

WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferBackend(PagedBackend):
    """Prefill (``BatchPrefillWithPagedKVCacheWrapper``, causal) and decode
    (``BatchDecodeWithPagedKVCacheWrapper``) over the NHD block tensor, plus the paged KV append."""

    def __init__(self, pool: PagedKVPool, num_qo_heads: int) -> None:
        import flashinfer

        super().__init__(pool)
        if pool.device.type != "cuda":
            raise ValueError("the FlashInfer backend needs a CUDA KV pool")
        self.num_qo_heads = num_qo_heads
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, kv_layout="NHD")
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, kv_layout="NHD")
        self._wrapper = None

    def plan(self, meta: BatchMetadata) -> None:
        self.meta = meta
        dev = self.pool.device
        self._kv_indptr = meta.kv_indptr.to(dev, non_blocking=True)
        self._kv_indices = meta.kv_indices.to(dev, non_blocking=True)
        self._last_page_len = meta.kv_last_page_len.to(dev, non_blocking=True)
        batch, positions = meta.new_token_positions()
        self._append_batch = batch.to(torch.int32).to(dev, non_blocking=True)
        self._append_pos = positions.to(torch.int32).to(dev, non_blocking=True)
        common = dict(
            num_qo_heads=self.num_qo_heads, num_kv_heads=self.pool.num_kv_heads, page_size=meta.page_size,
            pos_encoding_mode="NONE", q_data_type=self.pool.dtype, kv_data_type=self.pool.dtype,
        )
        if meta.is_decode:
            self.decode_wrapper.plan(
                meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, head_dim=self.pool.head_dim, **common
            )
            self._wrapper = self.decode_wrapper
        else:
            self.prefill_wrapper.plan(
                meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len,
                head_dim_qk=self.pool.head_dim, causal=True, **common,
            )
            self._wrapper = self.prefill_wrapper

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        import flashinfer

        assert self._wrapper is not None, "plan() must run before forward()"
        cache = (self.pool.k[layer_id], self.pool.v[layer_id])
        flashinfer.page.append_paged_kv_cache(
            k.contiguous(), v.contiguous(), self._append_batch, self._append_pos, cache,
            self._kv_indices, self._kv_indptr, self._last_page_len, kv_layout="NHD",
        )
        return self._wrapper.run(q.contiguous(), cache)
