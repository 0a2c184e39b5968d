"""Lesson 2: the block allocator, a free list of block ids over a KV pool.

It hands out *ids*, nothing else: it owns no tensors and does not know which request holds
which block (block tables do). Two promises, checked by a property test:

* a block is never handed out twice before it is freed;
* no block is ever lost: ``num_free + num_allocated == num_blocks`` at all times.
"""

from __future__ import annotations

__lesson__ = 2

from collections import deque
from collections.abc import Iterable

from minisgl.kvcache.errors import KVCacheFullError


class OutOfBlocksError(KVCacheFullError):
    """``alloc(n)`` asked for more blocks than are free. The allocator is left unchanged."""

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(f"KV pool exhausted: requested {requested} blocks, only {free} free")
        self.requested, self.free = requested, free


class InvalidFreeError(ValueError):
    """``free`` got a block that is not currently allocated (double free or foreign id)."""


class BlockAllocator:
    """Free list over block ids ``0 .. num_blocks - 1``.

    ``alloc`` is all-or-nothing; ``free`` validates the whole request before changing anything.
    Freed blocks go to the back of the queue (FIFO), so a just-freed block is reused last:
    that makes use-after-free bugs easier to notice, not harder.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._allocated: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_allocated(self) -> int:
        return len(self._allocated)

    def alloc(self, n: int) -> list[int]:
        """``n`` distinct free block ids, or :class:`OutOfBlocksError` (and no change)."""
        if n < 0:
            raise ValueError("cannot allocate a negative number of blocks")
        if n > len(self._free):
            raise OutOfBlocksError(n, len(self._free))
        blocks = [self._free.popleft() for _ in range(n)]
        self._allocated.update(blocks)
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Return blocks to the free list. Rejects double frees, duplicates and unknown ids."""
        blocks = list(blocks)
        if len(set(blocks)) != len(blocks):
            raise InvalidFreeError(f"duplicate block ids in one free: {blocks}")
        bad = [b for b in blocks if b not in self._allocated]
        if bad:
            raise InvalidFreeError(f"blocks {bad} are not allocated (double free or foreign id)")
        self._allocated.difference_update(blocks)
        self._free.extend(blocks)
