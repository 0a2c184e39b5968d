"""FlashInfer fused kernels for the model's small ops (CUDA only, imported lazily).

On the CPU everything runs as plain torch; on a CUDA device with FlashInfer installed the
model's RMSNorm and RoPE call these kernels instead. ``set_fused_kernels(False)`` forces the
torch path everywhere (useful to compare the two).
"""

from __future__ import annotations

__lesson__ = 1

import torch

from minisgl.utils import flashinfer_available

_enabled = True


def set_fused_kernels(enabled: bool) -> None:
    """Globally allow (default) or forbid fused kernels (FlashInfer's for norms and RoPE, and
    lesson 8's Triton kernels)."""
    global _enabled
    _enabled = enabled


def fused_kernels_enabled() -> bool:
    """False after ``set_fused_kernels(False)``: every model op runs its plain torch form."""
    return _enabled


def use_flashinfer(x: torch.Tensor) -> bool:
    return _enabled and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and flashinfer_available()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (any leading shape) with FlashInfer's kernel."""
    import flashinfer

    shape = x.shape
    out = flashinfer.norm.rmsnorm(x.reshape(-1, shape[-1]).contiguous(), weight, eps)
    return out.view(shape)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``residual = x + residual; x = rmsnorm(residual)``.

    FlashInfer works in place: both inputs are overwritten. The model only passes tensors it
    owns and no longer needs (a sub-layer's fresh output and the running residual).
    """
    import flashinfer

    x, residual = x.contiguous(), residual.contiguous()
    flashinfer.norm.fused_add_rmsnorm(x, residual, weight, eps)
    return x, residual


def apply_rope(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE (neox / rotate-half style) on ``q [T, Hq, D]`` and ``k [T, Hkv, D]``, **in place**.

    ``q`` and ``k`` may be strided views (the q and k parts of the fused QKV projection's
    output): the kernel follows their strides, so no copy is made (lesson 8: one kernel per
    layer instead of two copies and a kernel). The attention layer owns those tensors and
    needs only the rotated values."""
    import flashinfer

    T, _, D = q.shape
    flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
        positions=positions, query=q.view(T, -1), key=k.view(T, -1), head_size=D, cos_sin_cache=cos_sin_cache,
        is_neox=True,
    )
    return q, k


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` (last dim ``2 * I``) in one kernel -> ``[..., I]``."""
    import flashinfer

    return flashinfer.activation.silu_and_mul(gate_up)
