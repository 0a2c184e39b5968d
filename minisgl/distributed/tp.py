"""Lesson 9: the tensor-parallel group of this process and the two collectives the model needs.

Every rank runs the same program on its own slice of the weights. Two operations put the
slices back together:

* ``all_reduce(x)``: every rank holds a partial sum of the same ``[T, hidden]`` tensor (the
  output of a row-parallel matmul, or of the vocab-parallel embedding); afterwards every rank
  holds the full sum. Sent per layer and token: ``hidden`` numbers, twice per layer.
* ``all_gather_last_dim(x)``: every rank holds ``[T, vocab / tp]`` logits for its slice of the
  vocabulary; afterwards every rank holds ``[T, vocab]``, rank 0's columns first.

On GPUs that reach each other over NVLink, small all-reduces (every decode step's) go through
symmetric memory instead of NCCL (:mod:`minisgl.distributed.symmetric`, which says what that
measured): the same sum, exactly. There a row-parallel layer (and the embedding) may also leave
its sum for later (:meth:`TPGroup.reduce_later`): a :class:`PendingSum` that the pre-norm step
after it completes, the all-reduce, the residual add and the RMSNorm in one kernel
(:mod:`minisgl.distributed.all_reduce_norm`); and inside the graphs the logits' all-gather is
one kernel over symmetric memory too (:mod:`minisgl.distributed.all_gather`).

A process that never joined a group (one GPU, the tests of earlier lessons) has the trivial
group: rank 0 of 1, and both operations return their input.
"""

from __future__ import annotations

__lesson__ = 9

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the tensor-parallel group: ``rank`` of ``size``."""

    rank: int = 0
    size: int = 1
    group: Any = None  # the torch.distributed process group (None: the default one)
    symmetric: Any = None  # a SymmetricAllReduce for small CUDA tensors (None: NCCL/gloo for all)
    add_norm: Any = None  # an AllReduceAddNorm: all-reduce + residual add + RMSNorm in one kernel (None: none)
    gather: Any = None  # a SymmetricAllGather for the logits inside graphs (None: NCCL/gloo for all)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"TP rank {self.rank} is outside 0..{self.size - 1}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; every rank gets the same result."""
        if self.size == 1:
            return x
        if self.symmetric is not None and self.symmetric.fits(x):
            return self.symmetric.all_reduce(x)
        dist.all_reduce(x, group=self.group)
        return x

    def reduce_later(self, x: torch.Tensor) -> torch.Tensor | PendingSum:
        """``all_reduce(x)``, or, where ``add_norm`` takes ``x``, ``x`` left as a
        :class:`PendingSum` for the pre-norm step that follows (the caller's result must only
        reach lesson 1's ``add_and_norm``: a row-parallel layer's does). Decided by ``x``'s
        shape and dtype alone, so every rank decides alike."""
        if self.size > 1 and self.add_norm is not None and self.add_norm.fits(x):
            return PendingSum(x, self)
        return self.all_reduce(x)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n]`` on every rank -> ``[..., size * n]``: rank r's block is columns
        ``r * n .. (r + 1) * n``. (``all_gather_into_tensor`` stacks along dim 0, so the result
        is ``[size, ..., n]`` and must be moved to the last dimension, not reshaped: for more
        than one row a plain reshape would interleave the rows' slices.)"""
        if self.size == 1:
            return x
        x = x.contiguous()
        if self.gather is not None and self.gather.fits(x):
            return self.gather(x)
        stacked = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
        if x.device.type == "cpu":  # gloo has no all_gather_into_tensor
            dist.all_gather(list(stacked.unbind(0)), x, group=self.group)
        else:
            dist.all_gather_into_tensor(stacked, x, group=self.group)
        return torch.cat(stacked.unbind(0), dim=-1)

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks (e.g. the KV pages every rank can hold)."""
        if self.size == 1:
            return value
        backend = dist.get_backend(self.group)
        t = torch.tensor([value], dtype=torch.int64, device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


@dataclass(frozen=True)
class PendingSum:
    """This rank's partial sum ``[T, hidden]`` of a row-parallel layer, not yet all-reduced.

    The model hands a sub-layer's output to lesson 1's ``add_and_norm`` (the pre-norm step of
    the next sub-layer, or the final norm); given one of these, it calls :meth:`add_and_norm`,
    which runs the all-reduce with the residual add and the RMSNorm as one kernel."""

    partial: torch.Tensor
    tp: TPGroup

    def add_and_norm(self, norm: Any, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``norm.add_and_norm(all_reduce(partial), residual)``: ``(normed, new residual)``."""
        fused = self.tp.add_norm
        if fused is not None and fused.fits_norm(self.partial, residual, norm.weight):
            return fused(self.partial, residual, norm.weight, norm.eps)
        return norm.add_and_norm(self.tp.all_reduce(self.partial), residual)


_TP = TPGroup()


def get_tp() -> TPGroup:
    """The group of this process (rank 0 of 1 unless a rank launcher set one)."""
    return _TP


def set_tp(group: TPGroup) -> None:
    global _TP
    _TP = group
