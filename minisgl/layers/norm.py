"""RMSNorm, computed the way Hugging Face computes it (in float32, cast back before the weight)."""

from __future__ import annotations

__lesson__ = 1

import torch
from torch import nn

from minisgl.layers import fused


class RMSNorm(nn.Module):
    """``y = weight * x / sqrt(mean(x^2) + eps)`` over the last dimension.

    On CUDA (bf16/fp16) the FlashInfer fused kernel runs instead of the torch ops (lesson 3);
    both compute the same function.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.use_flashinfer(x):
            return fused.rmsnorm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual <- x + residual``, then RMSNorm of it: returns ``(normed, residual)``
        (``residual`` None, at the first layer: the residual stream starts at ``x``).

        The pre-norm transformer does this at every sub-layer boundary; on CUDA one fused
        FlashInfer kernel reads and writes each tensor once instead of three separate passes.
        """
        if residual is None:
            return self.forward(x), x
        if fused.use_flashinfer(x):
            return fused.add_rmsnorm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self.forward(residual), residual
