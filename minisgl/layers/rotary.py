"""Rotary position embedding (RoPE), including Llama 3.1's frequency rescaling.

RoPE rotates each (x_i, x_{i + D/2}) pair of a query/key head by ``position * inv_freq[i]``.
Because the rotation depends only on the token's *absolute* position, a key rotated once at
prefill time stays valid in the KV cache forever: that is why we cache K after RoPE.
"""

from __future__ import annotations

__lesson__ = 1

import math
from typing import Any

import torch
from torch import nn

from minisgl.layers import fused


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (float32), with llama3 scaling when given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    # between interpolated smoothly.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(in_band, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to flattened token streams.

    ``forward(positions [T], q [T, Hq, D], k [T, Hkv, D]) -> (q, k)`` rotated, same shapes.
    cos/sin are computed in float32 from the positions on every call (cheap, and exactly what
    HF does); on CUDA the FlashInfer kernel reads a precomputed cos/sin cache instead.
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)
        self._cos_sin_cache: torch.Tensor | None = None

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, D]`` cos and sin (float32) for the given positions."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def cos_sin_cache(self) -> torch.Tensor:
        """``[max_positions, D]`` float32: cos in the first half, sin in the second (FlashInfer's layout)."""
        if self._cos_sin_cache is None or self._cos_sin_cache.device != self.inv_freq.device:
            pos = torch.arange(self.max_positions, device=self.inv_freq.device, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq.float()[None, :]
            self._cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()
        return self._cos_sin_cache

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                q_norm: nn.Module | None = None, k_norm: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k``; with ``q_norm``/``k_norm`` (Qwen3's per-head RMSNorms),
        normalise each head first. (Lesson 8's ``DecodeRotary`` does all of it in one kernel.)"""
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        if fused.use_flashinfer(q):
            return fused.apply_rope(positions, q, k, self.cos_sin_cache())
        cos, sin = self.cos_sin(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
        q_out = (q.float() * cos + rotate_half(q.float()) * sin).to(q.dtype)
        k_out = (k.float() * cos + rotate_half(k.float()) * sin).to(k.dtype)
        return q_out, k_out
