"""Where K and V live: a contiguous slab per request (l01), a shared paged pool (l02, l03)."""

from minisgl.kvcache.contiguous import ContiguousKVCache, KVCacheFullError

__all__ = ["ContiguousKVCache", "KVCacheFullError"]
