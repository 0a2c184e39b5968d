"""group_by_expert() sorts the slots by expert with a plain ``argsort``, which is not stable.

Breaks "each expert's slots in increasing slot order": on more than a few dozen slots the CPU's
sort shuffles the slots of one expert, so the grouping is not the one its docstring promises
(and not reproducible from one sort implementation to the next).
"""
# first: lessons/l11/test_l11_fused_moe.py::test_slots_are_grouped_by_expert_in_whole_blocks

import torch

from minisgl.layers.fused_moe import BLOCK_M, max_blocks


def group_by_expert(ids, num_experts, block_m=BLOCK_M):
    num_slots = ids.numel()
    flat = ids.reshape(-1)
    order = torch.argsort(flat)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    run_start = torch.cumsum(counts, 0) - counts
    expert_of = flat[order]
    dest = padded_end[expert_of] - padded[expert_of] + torch.arange(num_slots) - run_start[expert_of]
    blocks = max_blocks(num_slots, num_experts, block_m)
    slots = torch.full((blocks * block_m,), num_slots, dtype=torch.int32)
    slots[dest] = order.to(torch.int32)
    block_expert = torch.searchsorted(padded_end, torch.arange(blocks) * block_m, right=True).to(torch.int32)
    return slots, block_expert
