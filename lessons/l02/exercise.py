"""Lesson 2 exercise: the block allocator and reserve-on-demand.

Write the four functions below, then run ``pytest lessons/l02 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

* :func:`alloc` and :func:`free` are :class:`minisgl.kvcache.allocator.BlockAllocator`'s methods.
  Its ``__init__`` (the package's) sets up ``self.num_blocks``, ``self._free`` (a
  ``collections.deque`` of free block ids, initially ``0 .. num_blocks - 1`` in order) and
  ``self._allocated`` (a ``set`` of the ids handed out). ``num_free`` is ``len(self._free)``,
  ``num_allocated`` is ``len(self._allocated)``.
* :func:`reserve` and :func:`slots` are :class:`minisgl.kvcache.block_table.BlockTable`'s
  methods. Its fields: ``self.block_size`` and ``self.blocks`` (the physical block ids of
  logical blocks 0, 1, ...); ``self.capacity == len(self.blocks) * self.block_size``.

Each function takes ``self``: it becomes a method of the package's class.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from minisgl.kvcache.allocator import BlockAllocator, InvalidFreeError, OutOfBlocksError  # noqa: F401
from minisgl.kvcache.block_table import BlockTable
from minisgl.utils import cdiv  # noqa: F401  (cdiv(a, b) == ceil(a / b) for ints)


def alloc(self: BlockAllocator, n: int) -> list[int]:
    """Hand out ``n`` distinct free block ids, taken from the *front* of ``self._free``.

    * ``n < 0``: ``ValueError``. ``n == 0``: ``[]``.
    * All or nothing: if fewer than ``n`` are free, raise ``OutOfBlocksError(n, num_free)``
      (its message reads "requested 4 blocks, only 3 free") and change nothing.
    * Every id handed out is recorded in ``self._allocated``.
    """
    raise NotImplementedError("exercise l02 alloc(): write BlockAllocator.alloc in lessons/l02/exercise.py")


def free(self: BlockAllocator, blocks: Iterable[int]) -> None:
    """Give ``blocks`` back: they go to the *back* of ``self._free`` (FIFO, so a just-freed block
    is reused last, which makes use-after-free bugs show).

    Validate the whole request before changing anything (``blocks`` may be any iterable; read it
    once). Raise ``InvalidFreeError`` with a message containing ``"duplicate"`` if an id repeats,
    or containing ``"not allocated"`` if an id is not currently allocated (a double free, or an id
    that never existed). On error nothing changes.

    Invariant after every call: ``num_free + num_allocated == num_blocks``.
    """
    raise NotImplementedError("exercise l02 free(): write BlockAllocator.free in lessons/l02/exercise.py")


def reserve(self: BlockTable, allocator: BlockAllocator, num_tokens: int) -> None:
    """Own enough blocks for positions ``0 .. num_tokens - 1``: allocate only the shortfall and
    append it to ``self.blocks`` (blocks already held never move). Asking for fewer tokens than
    the table holds changes nothing.

    All or nothing: if the allocator raises ``OutOfBlocksError``, the table must be unchanged
    (hint: ask the allocator for all the missing blocks in one call).

    Hint: ``num_tokens`` positions need ``cdiv(num_tokens, self.block_size)`` blocks in all
    (``num_tokens == 0`` needs none); the shortfall is that minus ``len(self.blocks)``.
    """
    raise NotImplementedError("exercise l02 reserve(): write BlockTable.reserve in lessons/l02/exercise.py")


def slots(self: BlockTable, start: int, end: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Slot ids of positions ``start .. end - 1``: an int64 tensor ``[end - start]`` on ``device``.

    Position ``p`` lives in slot ``blocks[p // block_size] * block_size + p % block_size``.
    Example: ``block_size=4, blocks=[5, 2, 9]``: ``slots(3, 6) == [23, 8, 9]``.

    Positions beyond the reservation are refused: ``end > self.capacity`` raises ``IndexError``
    with a message containing ``"beyond the reserved capacity"``. ``start == end`` gives ``[]``.

    Hint: vectorise with ``torch.arange`` and integer division; no Python loop is needed: index
    ``torch.tensor(self.blocks, dtype=torch.int64)`` with the logical block numbers (the table
    may be empty when ``start == end == 0``).
    """
    raise NotImplementedError("exercise l02 slots(): write BlockTable.slots in lessons/l02/exercise.py")
