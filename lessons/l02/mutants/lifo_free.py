"""free() puts the freed blocks at the front of the free list (appendleft), so they are reused first.

Breaks FIFO reuse: freed blocks go to the *back* of the free list, so a just-freed block is
reused last and a use-after-free shows (BlockAllocator.free's docstring).
"""
# first: lessons/l02/test_l02_blocks.py::test_blocks_are_reused_first_in_first_out

from collections.abc import Iterable

from minisgl.kvcache.allocator import BlockAllocator, InvalidFreeError


def free(self: BlockAllocator, blocks: Iterable[int]) -> None:
    blocks = list(blocks)
    if len(set(blocks)) != len(blocks):
        raise InvalidFreeError(f"duplicate block ids in one free: {blocks}")
    bad = [b for b in blocks if b not in self._allocated]
    if bad:
        raise InvalidFreeError(f"blocks {bad} are not allocated (double free or foreign id)")
    self._allocated.difference_update(blocks)
    for b in blocks:
        self._free.appendleft(b)  # BUG: the front of the queue
