"""reserve() counts the blocks as ``num_tokens // block_size + 1`` instead of ``cdiv(num_tokens, block_size)``.

Breaks "allocate only the shortfall": a length on a block boundary (and 0 tokens) gets one
block too many, so the pool runs out early.
"""
# first: lessons/l02/test_l02_blocks.py::test_reserve_allocates_only_when_crossing_a_block_boundary

from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.block_table import BlockTable


def reserve(self: BlockTable, allocator: BlockAllocator, num_tokens: int) -> None:
    needed = num_tokens // self.block_size + 1 - len(self.blocks)  # BUG: not a ceiling
    if needed > 0:
        self.blocks.extend(allocator.alloc(needed))
