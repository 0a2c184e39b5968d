"""reserve() allocates ``cdiv(num_tokens, block_size)`` blocks on every call, forgetting the blocks the table already holds.

Breaks "allocate only the shortfall": every decode step that reserves grabs a whole new set of
blocks, and the pool drains after a few steps.
"""
# first: lessons/l02/test_l02_blocks.py::test_reserve_allocates_only_when_crossing_a_block_boundary

from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.block_table import BlockTable
from minisgl.utils import cdiv


def reserve(self: BlockTable, allocator: BlockAllocator, num_tokens: int) -> None:
    needed = cdiv(num_tokens, self.block_size)  # BUG: minus len(self.blocks) is missing
    if needed > 0:
        self.blocks.extend(allocator.alloc(needed))
