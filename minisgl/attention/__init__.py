"""Attention backends: how attention reads and writes the KV cache.

The model never touches the cache itself. Each attention layer hands its freshly projected
``q, k, v`` to a backend, which stores ``k, v`` wherever the current KV layout says and attends
over the request's whole history. Lessons swap the backend, never the model:

* lesson 1: :class:`~minisgl.attention.contiguous.ContiguousBackend` (one request, one slab);
* lesson 2: :class:`~minisgl.attention.token_paged.TokenPagedBackend` (shared pool of slots);
* lesson 3: :class:`~minisgl.attention.paged.ReferencePagedBackend` and the FlashInfer backend.
"""

__lesson__ = 1

from minisgl.attention.base import AttentionBackend, NoCacheBackend
from minisgl.attention.dense import dense_causal_attention

__all__ = ["AttentionBackend", "NoCacheBackend", "dense_causal_attention"]
