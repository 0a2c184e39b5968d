"""alloc() pops blocks one at a time and raises when the free list runs dry, keeping what it popped.

Breaks "all or nothing": a failed alloc leaks the blocks it took before it failed (and its
error reports 0 free instead of what was free).
"""
# first: lessons/l02/test_l02_blocks.py::test_allocator_exhaustion_is_clear_and_changes_nothing

from minisgl.kvcache.allocator import BlockAllocator, OutOfBlocksError


def alloc(self: BlockAllocator, n: int) -> list[int]:
    if n < 0:
        raise ValueError("cannot allocate a negative number of blocks")
    blocks = []
    while len(blocks) < n:
        if not self._free:
            raise OutOfBlocksError(n, len(self._free))  # BUG: the blocks popped so far are lost
        blocks.append(self._free.popleft())
    self._allocated.update(blocks)
    return blocks
