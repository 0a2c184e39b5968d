"""group_by_expert() puts each expert's run right after the previous one, without padding runs to whole blocks.

Breaks "each expert's run starts at a multiple of block_m": a block holds the end of one
expert's run and the start of the next, and the kernel multiplies them all by one expert.
"""
# first: lessons/l11/test_l11_fused_moe.py::test_slots_are_grouped_by_expert_in_whole_blocks

import torch

from minisgl.layers.fused_moe import BLOCK_M, max_blocks


def group_by_expert(ids, num_experts, block_m=BLOCK_M):
    num_slots = ids.numel()
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    ends = torch.cumsum(counts, 0)
    blocks = max_blocks(num_slots, num_experts, block_m)
    slots = torch.full((blocks * block_m,), num_slots, dtype=torch.int32)
    slots[:num_slots] = order.to(torch.int32)
    starts = torch.arange(blocks) * block_m
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return slots, block_expert
