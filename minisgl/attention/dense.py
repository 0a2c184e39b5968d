"""Plain dense attention in torch: the definition every backend must agree with."""

from __future__ import annotations

__lesson__ = 1

import torch


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int) -> torch.Tensor:
    """Causal attention of ``T`` new queries over ``S = num_cached + T`` keys of one request.

    ``q [T, Hq, D]``, ``k, v [S, Hkv, D]`` -> ``[T, Hq, D]``. Query ``i`` sits at absolute
    position ``num_cached + i`` and sees keys ``0 .. num_cached + i``. Grouped-query attention:
    query head ``h`` reads KV head ``h // (Hq // Hkv)``. Softmax runs in float32.
    """
    T, Hq, D = q.shape
    S, Hkv, _ = k.shape
    if S != num_cached + T:
        raise ValueError(f"expected {num_cached} + {T} keys, got {S}")
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=1)  # [S, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) * (D**-0.5)  # [Hq, T, S]
    q_pos = torch.arange(T, device=q.device)[:, None] + num_cached
    k_pos = torch.arange(S, device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = scores.softmax(dim=-1)
    out = torch.einsum("hts,shd->thd", probs, v.float())
    return out.to(q.dtype)
