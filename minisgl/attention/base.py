"""The attention-backend interface every KV layout implements."""

from __future__ import annotations

__lesson__ = 1

from abc import ABC, abstractmethod

import torch
from torch import nn

from minisgl.attention.dense import dense_causal_attention


class AttentionBackend(ABC):
    """Stores new K/V and attends over the cached history, one layer at a time.

    The driver (generate loop or scheduler) first describes the coming forward pass to the
    backend (which request, how many cached tokens, where new K/V go): that is the backend's
    *metadata*, set by a backend-specific ``prepare``/``plan`` call. Then the model runs and
    every attention layer calls :meth:`forward`.

    Shapes: ``q [T, Hq, D]``, ``k, v [T, Hkv, D]`` where ``T`` is the number of new tokens in
    the (flattened) forward pass; the result is ``[T, Hq, D]``.
    """

    #: Lesson 8: True while the backend's kernel applies RoPE (and Qwen3's q/k norms) to the
    #: new q/k itself; the model then calls :meth:`forward_rotating` with them unrotated.
    rotates_qk: bool = False

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        ...

    def forward_rotating(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                         positions: torch.Tensor, rotary: nn.Module, q_norm: nn.Module | None,
                         k_norm: nn.Module | None) -> torch.Tensor:
        """:meth:`forward` of ``rotary(positions, q, k, q_norm, k_norm)``: what a backend with
        ``rotates_qk`` computes in one kernel. This default rotates first, then attends."""
        q, k = rotary(positions, q, k, q_norm, k_norm)
        return self.forward(q, k, v, layer_id)


class NoCacheBackend(AttentionBackend):
    """No cache at all: the forward pass must contain the whole sequence (one request).

    This is what ``model(full_sequence)`` means, and the yardstick the cached backends are
    compared against: decoding with a cache must give the same logits as recomputing everything.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        return dense_causal_attention(q, k, v, num_cached=0)
