"""Lesson 3: pick a paged attention backend by name.

A module of its own so that the backends (which build on :mod:`minisgl.attention.paged`) and
the place that chooses among them do not import each other in a circle.
"""

from __future__ import annotations

__lesson__ = 3

from minisgl.attention.paged import PagedBackend, ReferencePagedBackend, TorchPagedBackend
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.utils import flashinfer_available

ATTENTION_BACKENDS = ("auto", "reference", "torch", "flashinfer", "triton")


def make_paged_backend(pool: PagedKVPool, num_qo_heads: int, kind: str = "auto") -> PagedBackend:
    """``"auto"``: FlashInfer on CUDA when installed, else ``"torch"`` (the reference with
    vectorised decode). Or ``"reference"``, ``"flashinfer"``, or ``"triton"`` (lesson 3's
    hand-written decode kernel, CUDA only). FlashInfer and Triton are imported only when chosen."""
    if kind == "auto":
        kind = "flashinfer" if pool.device.type == "cuda" and flashinfer_available() else "torch"
    if kind == "reference":
        return ReferencePagedBackend(pool)
    if kind == "torch":
        return TorchPagedBackend(pool)
    if kind == "flashinfer":
        from minisgl.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(pool, num_qo_heads)
    if kind == "triton":
        from minisgl.attention.triton_decode import TritonDecodeBackend

        return TritonDecodeBackend(pool)
    raise ValueError(f"unknown attention backend {kind!r} ({', '.join(ATTENTION_BACKENDS)})")
