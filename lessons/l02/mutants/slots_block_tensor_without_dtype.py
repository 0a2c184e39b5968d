"""slots() builds the block tensor with ``torch.tensor(self.blocks)``, without ``dtype=torch.int64``.

Breaks "an int64 tensor": for a table with no blocks yet (``slots(0, 0)``) ``torch.tensor([])``
is float32, so the slots come out float and cannot index the pool (the docstring's hint).
"""
# first: lessons/l02/test_l02_blocks.py::test_slot_is_block_id_times_block_size_plus_offset

import torch

from minisgl.kvcache.block_table import BlockTable


def slots(self: BlockTable, start: int, end: int, device: str | torch.device = "cpu") -> torch.Tensor:
    if end > self.capacity:
        raise IndexError(f"position {end - 1} is beyond the reserved capacity {self.capacity}")
    pos = torch.arange(start, end)
    blocks = torch.tensor(self.blocks)  # BUG: float32 when the table is empty
    return (blocks[pos // self.block_size] * self.block_size + pos % self.block_size).to(device)
