"""Lesson 2: a request's block table and reserve-on-demand."""

from __future__ import annotations

__lesson__ = 2

from dataclasses import dataclass, field

import torch

from minisgl.kvcache.allocator import BlockAllocator
from minisgl.utils import cdiv


@dataclass
class BlockTable:
    """Logical block ``i`` of one request lives in physical block ``blocks[i]``.

    Position ``p`` of the sequence is stored in slot ``blocks[p // block_size] * block_size +
    p % block_size``. Invariant: ``capacity == len(blocks) * block_size`` and blocks are only
    added at the end, so slots of positions already written never move.
    """

    block_size: int
    blocks: list[int] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def reserve(self, allocator: BlockAllocator, num_tokens: int) -> None:
        """Own enough blocks to hold ``num_tokens`` positions (allocates only the shortfall).

        All-or-nothing: on :class:`~minisgl.kvcache.allocator.OutOfBlocksError` the table is unchanged.
        """
        needed = cdiv(num_tokens, self.block_size) - len(self.blocks)
        if needed > 0:
            self.blocks.extend(allocator.alloc(needed))

    def slots(self, start: int, end: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """Slot ids ``[end - start]`` (int64) of positions ``start .. end - 1``."""
        if end > self.capacity:
            raise IndexError(f"position {end - 1} is beyond the reserved capacity {self.capacity}")
        pos = torch.arange(start, end)
        blocks = torch.tensor(self.blocks, dtype=torch.int64)
        return (blocks[pos // self.block_size] * self.block_size + pos % self.block_size).to(device)

    def release(self, allocator: BlockAllocator) -> None:
        """Give every block back (the request is finished)."""
        allocator.free(self.blocks)
        self.blocks = []
