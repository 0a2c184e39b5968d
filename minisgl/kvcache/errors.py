"""The error every KV store raises when it has no room left (lessons 1-4 share it)."""

from __future__ import annotations

__lesson__ = 1


class KVCacheFullError(RuntimeError):
    """A request needs more KV capacity than its cache (or the shared pool) can give."""
