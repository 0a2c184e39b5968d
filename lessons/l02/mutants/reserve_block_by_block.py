"""reserve() asks the allocator for the missing blocks one at a time.

Breaks "all or nothing": when the pool runs out halfway, the table keeps the blocks it got
before the error (the docstring's hint: ask for all the missing blocks in one call).
"""
# first: lessons/l02/test_l02_blocks.py::test_block_table_reserve_exhaustion_leaves_table_and_pool_unchanged

from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.block_table import BlockTable
from minisgl.utils import cdiv


def reserve(self: BlockTable, allocator: BlockAllocator, num_tokens: int) -> None:
    while len(self.blocks) < cdiv(num_tokens, self.block_size):
        self.blocks.extend(allocator.alloc(1))  # BUG: a failure halfway leaves the table grown
