"""A torch stand-in for lesson 9's fused all-reduce + residual add + RMSNorm, for the tests of
tensor-parallel ranks on the CPU (lessons 9 and 11)."""

from __future__ import annotations

__lesson__ = 'tooling'

import dataclasses

import torch


class TorchAddNorm:
    """Lesson 9's fused all-reduce + residual add + RMSNorm (``TPGroup.add_norm``) as plain torch
    ops over gloo, for any row count: on the CPU it makes every row-parallel layer, and the
    embedding, leave its sum to the pre-norm step after it (a ``PendingSum``), as the GPU kernel
    does. ``forget`` names the sums a broken step adds this rank's part of alone (forgetting the
    other rank): ``"layers"``, those with a residual stream (the row-parallel layers'), or
    ``"embedding"``, the one without (the first layer's)."""

    def __init__(self, forget: str | None = None) -> None:
        self.forget = forget

    def fits(self, x: torch.Tensor) -> bool:
        return x.dim() == 2

    def fits_norm(self, partial: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> bool:
        return True

    def __call__(self, partial: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.distributed as dist

        h = partial.clone()
        if self.forget != ("embedding" if residual is None else "layers"):
            dist.all_reduce(h)
        residual = h if residual is None else h + residual  # None: the first layer's, after the embedding
        x32 = residual.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(residual.dtype), residual


def fused_add_norm_in_torch(rank: int, forget: str | None = None) -> None:
    """``rank_init`` of the CPU tests of the fused step (``LLM(..., rank_init="minisgl.testing.tp:
    fused_add_norm_in_torch")``, lessons 9 and 11): this rank's TP group gets a
    :class:`TorchAddNorm`, before the model is built (its layers take the group then), so every
    row-parallel layer's sum, the embedding's and each mixture-of-experts layer's waits for the
    pre-norm step after it, as on GPUs."""
    from minisgl.distributed.tp import get_tp, set_tp

    set_tp(dataclasses.replace(get_tp(), add_norm=TorchAddNorm(forget)))
