"""free() loops over ``blocks`` twice, once to validate and once to free: a generator is empty the second time.

Breaks "blocks may be any iterable; read it once": freeing from a generator frees nothing, and
the blocks leak (num_free + num_allocated stays right, but they stay allocated forever).
"""
# first: lessons/l02/test_l02_blocks.py::test_free_takes_any_iterable_once

from collections.abc import Iterable

from minisgl.kvcache.allocator import BlockAllocator, InvalidFreeError


def free(self: BlockAllocator, blocks: Iterable[int]) -> None:
    seen = set()
    for b in blocks:
        if b in seen:
            raise InvalidFreeError(f"duplicate block id {b} in one free")
        if b not in self._allocated:
            raise InvalidFreeError(f"block {b} is not allocated (double free or foreign id)")
        seen.add(b)
    for b in blocks:  # BUG: a second pass over an iterator sees nothing
        self._allocated.remove(b)
        self._free.append(b)
