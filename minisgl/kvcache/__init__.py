"""Where K and V live: a contiguous slab per request (l01), a shared paged pool (l02, l03)."""

__lesson__ = 3

from minisgl.kvcache.allocator import BlockAllocator, InvalidFreeError, OutOfBlocksError
from minisgl.kvcache.block_table import BlockTable
from minisgl.kvcache.contiguous import ContiguousKVCache
from minisgl.kvcache.errors import KVCacheFullError
from minisgl.kvcache.sizing import num_blocks_for_budget, num_slots_for_budget
from minisgl.kvcache.token_pool import TokenKVPool

__all__ = [
    "BlockAllocator",
    "BlockTable",
    "ContiguousKVCache",
    "InvalidFreeError",
    "KVCacheFullError",
    "OutOfBlocksError",
    "TokenKVPool",
    "num_blocks_for_budget",
    "num_slots_for_budget",
]
