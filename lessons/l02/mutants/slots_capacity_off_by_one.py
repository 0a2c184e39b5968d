"""slots() refuses ``end == capacity`` (``end >= self.capacity``) instead of only ``end > capacity``.

Breaks the slot lookup of a full reservation: the last position of the last block is refused,
so a request whose length is a multiple of the block size fails.
"""
# first: lessons/l02/test_l02_blocks.py::test_slot_is_block_id_times_block_size_plus_offset

import torch

from minisgl.kvcache.block_table import BlockTable


def slots(self: BlockTable, start: int, end: int, device: str | torch.device = "cpu") -> torch.Tensor:
    if end >= self.capacity:  # BUG: off by one
        raise IndexError(f"position {end - 1} is beyond the reserved capacity {self.capacity}")
    pos = torch.arange(start, end)
    blocks = torch.tensor(self.blocks, dtype=torch.int64)
    return (blocks[pos // self.block_size] * self.block_size + pos % self.block_size).to(device)
