"""Lesson 9 on GPUs: small all-reduces through symmetric memory instead of NCCL.

A bs=1 decode step of Llama-3.1-8B all-reduces a ``[1, 4096]`` bf16 activation (8 KiB) 65
times. NCCL is built for bandwidth; for a message this small it is all latency. Whether this
path pays inside a real decode step is lesson 9's experiment: its README has the measurements
(``python -m benchmarks tp``).

*Symmetric memory*: every rank allocates a buffer of the same size, and each maps the others'
buffers into its own address space (CUDA IPC over NVLink); PyTorch's
``torch.distributed._symmetric_memory`` sets this up. A **one-shot** all-reduce is then one
kernel: each rank copies its tensor into its own buffer, the ranks meet at a barrier (flags in
small "signal pads" every rank can write), and every rank reads all the buffers and sums them
itself. PyTorch's ``one_shot_all_reduce_copy_out`` does the copy inside that kernel; without it
(older PyTorch) the copy is a kernel of its own, one more launch per all-reduce: at bs=1 a
decode step of Llama-3.1-8B on two GPUs launches 65 of them. Each GPU reads ``size`` copies
of the tensor, which is cheap only while the tensor is small: above ``BUFFER_BYTES`` (prefill
chunks of thousands of tokens) NCCL's ring is used.
"""

from __future__ import annotations

__lesson__ = 9

import importlib.util

import torch
import torch.distributed as dist

BUFFER_BYTES = 4 << 20  # tensors up to this size (bs <= 512 at hidden 4096 in bf16) take the fast path
DTYPES = (torch.bfloat16, torch.float32)  # what PyTorch's one-shot kernel reduces


def symmetric_all_reduce_available(device: torch.device | str, size: int) -> bool:
    """Whether this process can use :class:`SymmetricAllReduce`: CUDA, PyTorch's symmetric
    memory ops present, and every pair of the ``size`` GPUs able to reach each other (P2P)."""
    device = torch.device(device)
    if device.type != "cuda" or size < 2:
        return False
    if importlib.util.find_spec("torch.distributed._symmetric_memory") is None:
        return False
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
        return False
    return all(torch.cuda.can_device_access_peer(a, b) for a in range(size) for b in range(size) if a != b)


class SymmetricAllReduce:
    """One-shot all-reduce over a symmetric buffer of ``buffer_bytes`` (every rank creates it
    together: the constructor is a collective).

    Invariant: calls happen in the same order on every rank (as every collective's must), and
    one at a time: the buffer is shared by all calls, so two all-reduces in flight on different
    streams would overwrite each other's input.
    """

    def __init__(self, device: torch.device | str, group: dist.ProcessGroup | None = None,
                 buffer_bytes: int = BUFFER_BYTES) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        self.group_name = group.group_name
        self.buffer_bytes = buffer_bytes
        self.buffer = symm_mem.empty(buffer_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)  # exchange the IPC handles
        self.copy_inside = hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out")

    def fits(self, x: torch.Tensor) -> bool:
        return (x.is_cuda and x.dtype in DTYPES and x.is_contiguous()
                and x.numel() * x.element_size() <= self.buffer_bytes)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (any shape, ``fits``) over the ranks, in place.

        In place is safe with the copy inside the kernel: each of its threads copies the
        elements it later writes the sums of, and reads only the buffers between the two."""
        flat = x.view(-1)
        mine = self.buffer.view(x.dtype)[: flat.numel()]
        if self.copy_inside:
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(mine, flat, "sum", self.group_name, flat)
        else:
            mine.copy_(flat)
            torch.ops.symm_mem.one_shot_all_reduce_out(mine, "sum", self.group_name, flat)
        return x
