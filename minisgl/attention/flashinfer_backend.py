"""Lesson 3: FlashInfer's paged attention kernels (CUDA only; FlashInfer is imported lazily).

FlashInfer splits each kernel call in two: ``plan`` looks at the batch shape (how many queries
and pages per request) on the CPU and decides how to split the work across thread blocks;
``run`` launches the kernel. A batch is planned once and then run for every layer, because all
layers of one forward pass see the same batch shape.

Lesson 7 (overlap scheduling) plans batch N+1 while batch N still runs. A FlashInfer wrapper
keeps its plan in its own buffers (a pinned host buffer copied asynchronously to a device
workspace), so planning the same wrapper again could overwrite what batch N is still reading,
or reuse the pinned buffer before its copy has left it. The backend therefore keeps a small
ring of wrapper sets, each with its own workspace, and before planning a set again it waits
for the event recorded after the last forward pass that used it.
"""

from __future__ import annotations

__lesson__ = 3

import torch

from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import PagedBackend
from minisgl.kvcache.paged_pool import PagedKVPool

WORKSPACE_BYTES = 128 * 1024 * 1024
NUM_PLAN_SLOTS = 2  # batches that may be planned or running at once (overlap keeps 2 in flight)

# FlashInfer has two decode kernels: one on CUDA cores, one on tensor cores (its prefill kernel
# with one query row per request). Measured on the H200 (bf16, head_dim 128, captured in a graph;
# ``python -m benchmarks graphs`` records the sweep): with 4 or more query heads per KV head
# (Llama-3.1-8B) the tensor-core kernel is faster everywhere, 1.8x at bs=1 x 1k tokens (20.4 ->
# 11.2 us per layer) and 1.7x at bs=64 x 32k tokens; with 2 (Qwen3-0.6B) the CUDA-core kernel
# wins by 1-2 us on small batches, the tensor-core one on big batches of long rows (bs=16 x 32k,
# bs=64 x 4k).
TENSOR_CORE_DECODE_MIN_GROUP = 4
TENSOR_CORE_DECODE_MIN_BATCH = 32


def decode_uses_tensor_cores(num_qo_heads: int, num_kv_heads: int, batch_size: int) -> bool:
    """Which FlashInfer decode kernel a decode batch of ``batch_size`` rows uses (see above)."""
    group = num_qo_heads // num_kv_heads
    return group >= TENSOR_CORE_DECODE_MIN_GROUP or batch_size >= TENSOR_CORE_DECODE_MIN_BATCH


class PinnedInts:
    """Page-locked int32 host memory for a batch's metadata, so that its copies to the device
    are truly asynchronous. (From ordinary pageable memory a copy may wait until the device has
    finished everything queued before it, and the host would stall behind the running batch,
    which is exactly what overlap scheduling must avoid.) Its owner reuses it only after the
    copies out of it have completed."""

    def __init__(self, capacity: int = 1 << 14) -> None:
        self.buffer = torch.empty(capacity, dtype=torch.int32, pin_memory=True)

    def stage(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Pinned int32 copies of ``tensors`` (1-D), as views of one buffer."""
        sizes = [t.numel() for t in tensors]
        if sum(sizes) > self.buffer.numel():
            self.buffer = torch.empty(max(sum(sizes), 2 * self.buffer.numel()), dtype=torch.int32, pin_memory=True)
        views = list(self.buffer[: sum(sizes)].split(sizes))
        for view, t in zip(views, tensors):
            view.copy_(t)
        return views


class _PlanSlot:
    """One set of wrappers with its own workspace and pinned staging, and the event that says
    when it is free."""

    def __init__(self, device: torch.device) -> None:
        import flashinfer

        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, kv_layout="NHD")
        self.decode = {  # keyed by "tensor cores?" (decode_uses_tensor_cores); one is planned per batch
            tc: flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, kv_layout="NHD", use_tensor_cores=tc)
            for tc in (False, True)
        }
        self.pinned = PinnedInts()
        self.done: torch.cuda.Event | None = None  # recorded after the last forward that used it


class FlashInferBackend(PagedBackend):
    """Prefill (``BatchPrefillWithPagedKVCacheWrapper``, causal) and decode
    (``BatchDecodeWithPagedKVCacheWrapper``) over the NHD block tensor, plus the paged KV append."""

    def __init__(self, pool: PagedKVPool, num_qo_heads: int) -> None:
        super().__init__(pool)
        if pool.device.type != "cuda":
            raise ValueError("the FlashInfer backend needs a CUDA KV pool")
        self.num_qo_heads = num_qo_heads
        self.slots = [_PlanSlot(pool.device) for _ in range(NUM_PLAN_SLOTS)]
        self._next_slot = 0
        self._slot: _PlanSlot | None = None
        self._wrapper = None

    def _plan(self, meta: BatchMetadata) -> None:
        slot = self.slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self.slots)
        if slot.done is not None:
            slot.done.synchronize()  # the batch that last used these buffers has finished
            slot.done = None
        self._slot = slot
        self.meta = meta
        dev = self.pool.device
        batch, positions = meta.new_token_positions()
        qo_indptr, kv_indptr, kv_indices, last_page_len, append_batch, append_pos = slot.pinned.stage(
            [meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, batch, positions])
        self._kv_indptr = kv_indptr.to(dev, non_blocking=True)
        self._kv_indices = kv_indices.to(dev, non_blocking=True)
        self._last_page_len = last_page_len.to(dev, non_blocking=True)
        self._append_batch = append_batch.to(dev, non_blocking=True)
        self._append_pos = append_pos.to(dev, non_blocking=True)
        common = dict(
            num_qo_heads=self.num_qo_heads, num_kv_heads=self.pool.num_kv_heads, page_size=meta.page_size,
            pos_encoding_mode="NONE", q_data_type=self.pool.dtype, kv_data_type=self.pool.dtype,
        )
        if meta.is_decode:  # (indices on the device: FlashInfer copies host indices synchronously)
            tc = decode_uses_tensor_cores(self.num_qo_heads, self.pool.num_kv_heads, meta.batch_size)
            slot.decode[tc].plan(kv_indptr, self._kv_indices, last_page_len, head_dim=self.pool.head_dim, **common)
            self._wrapper = slot.decode[tc]
        else:
            slot.prefill.plan(
                qo_indptr, kv_indptr, self._kv_indices, last_page_len,
                head_dim_qk=self.pool.head_dim, causal=True, **common,
            )
            self._wrapper = slot.prefill

    def batch_enqueued(self) -> None:
        """Mark this batch's wrapper set busy until the device has run everything enqueued so far."""
        self._slot.done = torch.cuda.Event()
        self._slot.done.record()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        import flashinfer

        assert self._wrapper is not None, "plan() must run before forward()"
        cache = (self.pool.k[layer_id], self.pool.v[layer_id])
        flashinfer.page.append_paged_kv_cache(
            k, v, self._append_batch, self._append_pos, cache,
            self._kv_indices, self._kv_indptr, self._last_page_len, kv_layout="NHD",
        )
        return self._wrapper.run(q, cache)
