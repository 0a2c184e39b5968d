"""free() checks for repeats up front, then frees block by block and raises at the first id that is not allocated.

Breaks "on error nothing changes": the valid ids before the bad one are already freed when the
error is raised (BlockAllocator.free: validate the whole request before changing anything).
"""
# first: lessons/l02/test_l02_blocks.py::test_a_rejected_free_changes_nothing

from collections.abc import Iterable

from minisgl.kvcache.allocator import BlockAllocator, InvalidFreeError


def free(self: BlockAllocator, blocks: Iterable[int]) -> None:
    blocks = list(blocks)
    if len(set(blocks)) != len(blocks):
        raise InvalidFreeError(f"duplicate block ids in one free: {blocks}")
    for b in blocks:  # BUG: validates while it changes the allocator
        if b not in self._allocated:
            raise InvalidFreeError(f"block {b} is not allocated (double free or foreign id)")
        self._allocated.remove(b)
        self._free.append(b)
