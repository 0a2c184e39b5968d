"""alloc() takes its blocks from the back of the free list (pop) instead of the front (popleft).

Breaks FIFO reuse: the blocks freed last are handed out first (BlockAllocator.alloc: "taken
from the *front* of self._free").
"""
# first: lessons/l02/test_l02_blocks.py::test_blocks_are_reused_first_in_first_out

from minisgl.kvcache.allocator import BlockAllocator, OutOfBlocksError


def alloc(self: BlockAllocator, n: int) -> list[int]:
    if n < 0:
        raise ValueError("cannot allocate a negative number of blocks")
    if n > len(self._free):
        raise OutOfBlocksError(n, len(self._free))
    blocks = [self._free.pop() for _ in range(n)]  # BUG: the back of the queue
    self._allocated.update(blocks)
    return blocks
