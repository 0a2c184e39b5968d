"""Lesson 11: mixture of experts (Qwen3-MoE, Qwen2-MoE), the reference path.

A mixture-of-experts layer replaces the one dense SwiGLU MLP of a decoder layer with ``E``
smaller SwiGLU MLPs (the *experts*) and a *router* that sends each token to ``k`` of them:

1. router logits ``x @ W_gate.T``: ``[T, E]``;
2. softmax over the experts, in float32;
3. keep the ``k`` largest probabilities per token: weights ``[T, k]`` and expert ids ``[T, k]``;
4. with ``norm_topk_prob``, rescale each token's ``k`` weights to sum to 1;
5. each token's output is the weighted sum of its ``k`` experts' SwiGLU outputs.

A token touches ``k`` of the ``E`` experts, so a step reads (and computes with) only a fraction
of the layer's weights: Qwen3-30B-A3B has 128 experts and routes to 8. Qwen2-MoE adds a
*shared expert* that every token uses, scaled by its own gate, ``sigmoid(x @ w.T)``.

:func:`reference_moe` computes step 5 the readable way: one expert at a time, over the tokens
routed to it, adding the weighted results into the output rows. On a GPU that loop is slow (a
few tiny matmuls per expert, and a host sync to learn which experts are used); grouping the
tokens by expert and running every expert in one kernel is the fix
(:mod:`minisgl.layers.fused_moe`, which :class:`Experts` uses on CUDA).

Weights are stacked per expert, the layout ``transformers`` keeps in memory:
``gate_up_proj [E, 2 * I, hidden]`` (each expert's gate rows, then its up rows) and
``down_proj [E, hidden, I]``. Under tensor parallelism (lesson 9) every rank holds a slice of
*every* expert: ``I`` is ``moe_intermediate_size / tp``, each rank's output is a partial sum,
and one all-reduce per layer completes it.

:class:`MoELayers` plugs all this into the model through lesson 1's ``Layers.mlp`` seam.
"""

from __future__ import annotations

__lesson__ = 11

import re

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.config import ModelConfig
from minisgl.distributed.tp import TPGroup, get_tp
from minisgl.layers import RotaryEmbedding
from minisgl.layers.fused_moe import fused_moe, fused_moe_available
from minisgl.models.model import Layers


class Router(nn.Module):
    """Picks each token's experts: ``[T, hidden] -> (weights [T, k], expert ids [T, k])``.

    ``weight [E, hidden]`` is HF's ``mlp.gate.weight``. The softmax runs in float32 over all
    ``E`` experts *before* the top-k (so a token's ``k`` weights sum to less than 1 unless
    renormalised); the weights come back in ``x``'s dtype, the ids as int64, largest first.
    """

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, renormalize: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.top_k = top_k
        self.renormalize = renormalize

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight)  # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = probs.topk(self.top_k, dim=-1)  # [T, k] each
        if self.renormalize:  # norm_topk_prob
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids


def reference_moe(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                  weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` for every token ``t``: ``[T, hidden]``.

    ``x [T, hidden]``; ``gate_up_proj [E, 2I, hidden]``; ``down_proj [E, hidden, I]``;
    ``weights [T, k]`` and ``ids [T, k]`` from :class:`Router`. An expert is
    ``down(silu(gate(x)) * up(x))``. One expert at a time, in increasing id order, over the
    tokens routed to it; experts no token chose cost nothing.
    """
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():  # sorted; a host sync on a GPU
        token, slot = (ids == expert).nonzero(as_tuple=True)  # which tokens chose it, and as which of their k
        gate, up = F.linear(x[token], gate_up_proj[expert]).chunk(2, dim=-1)  # [n, I] each
        y = F.linear(F.silu(gate) * up, down_proj[expert])  # [n, hidden]
        # out[token] += weight * y. (Tensor.index_add_ does the same, but on a busy 2-core CPU with
        # two torch threads it was measured at ~12 ms a call for one row, this at ~2 us.)
        out.index_put_((token,), y * weights[token, slot, None], accumulate=True)
    return out


class Experts(nn.Module):
    """The ``E`` SwiGLU experts of one layer, stacked: ``gate_up_proj [E, 2I, hidden]`` and
    ``down_proj [E, hidden, I]`` (``I``: this rank's slice of ``moe_intermediate_size``).

    :meth:`checkpoint_pieces` tells the loader where each checkpoint tensor goes, for both
    layouts: the hub's one matrix per expert (``experts.{e}.gate_proj.weight [I, hidden]``, ...)
    and the stacked ``experts.gate_up_proj`` / ``experts.down_proj`` of the layout above. A
    single expert (Qwen2-MoE's shared one) also reads names without the number
    (``shared_expert.gate_proj.weight``).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, tp_size: int = 1) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.tp_size = tp_size  # the checkpoint's experts are tp_size times wider

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and fused_moe_available():  # every expert in two launches, no host sync
            return fused_moe(x, self.gate_up_proj, self.down_proj, weights, ids)
        return reference_moe(x, self.gate_up_proj, self.down_proj, weights, ids)

    def checkpoint_pieces(self, key: str, tp_rank: int) -> list[tuple[str, tuple, tuple]] | None:
        """Where checkpoint tensor ``key`` (its name below this module, e.g. ``"3.up_proj.weight"``)
        goes: ``(parameter, index into the parameter, index into the checkpoint tensor)`` pieces,
        or None for a tensor this module does not know. Under TP, rank ``r`` reads rows (gate,
        up) or columns (down) ``r * n .. (r + 1) * n`` of every expert's intermediate features
        (``n``: this rank's ``I``)."""
        n, every = self.intermediate_size, slice(None)
        mine = slice(tp_rank * n, (tp_rank + 1) * n)  # this rank's intermediate features
        m = re.fullmatch(r"(?:(\d+)\.)?(gate|up|down)_proj\.weight", key)
        if m:  # the hub's layout: one [I, hidden] (gate, up) or [hidden, I] (down) matrix per expert
            expert, which = int(m[1] or 0), m[2]
            if expert >= self.num_experts or (m[1] is None and self.num_experts != 1):
                return None
            if which == "down":
                return [("down_proj", (expert,), (every, mine))]
            half = slice(0, n) if which == "gate" else slice(n, 2 * n)
            return [("gate_up_proj", (expert, half), (mine,))]
        if key == "gate_up_proj":  # stacked [E, 2 * I_full, hidden]: gate rows, then up rows
            full = n * self.tp_size
            up = slice(full + mine.start, full + mine.stop)
            return [("gate_up_proj", (every, slice(0, n)), (every, mine)),
                    ("gate_up_proj", (every, slice(n, 2 * n)), (every, up))]
        if key == "down_proj":  # stacked [E, hidden, I_full]
            return [("down_proj", (), (every, every, mine))]
        return None


class SparseMoE(nn.Module):
    """A mixture-of-experts MLP, ``[T, hidden] -> [T, hidden]``: HF's ``mlp`` of a sparse layer
    (``mlp.gate`` the router, ``mlp.experts`` the experts; Qwen2-MoE: ``mlp.shared_expert``, one
    expert every token uses, weighted by ``sigmoid(mlp.shared_expert_gate(x))``). Under TP the
    experts' partial sums are all-reduced here, once per layer."""

    def __init__(self, config: ModelConfig, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.tp = tp or get_tp()
        self.gate = Router(config.hidden_size, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size, config.tp_size)
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = Experts(1, config.hidden_size, config.shared_expert_intermediate_size, config.tp_size)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)  # whole on every rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)  # [T, k], [T, k]
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:  # every token "routed" to expert 0 of the shared one
            gate = torch.sigmoid(self.shared_expert_gate(x))  # [T, 1]
            out = out + self.shared_expert(x, gate, torch.zeros_like(gate, dtype=torch.int64))
        return self.tp.all_reduce(out)


class MoELayers(Layers):
    """Lesson 1's :class:`Layers` seam with mixture-of-experts MLPs: ``base``'s layers (plain,
    lesson 8's decode kernels or lesson 9's parallel slices) for everything else, dense MLPs
    included, and a :class:`SparseMoE` in every layer ``config.is_moe_layer`` names."""

    def __init__(self, base: Layers | None = None, tp: TPGroup | None = None) -> None:
        self.base = base or Layers()
        self.tp = tp

    def mlp(self, config: ModelConfig, layer_id: int) -> nn.Module:
        if config.is_moe_layer(layer_id):
            return SparseMoE(config, self.tp)
        return self.base.mlp(config, layer_id)

    # Everything else is ``base``'s.
    def column(self, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
        return self.base.column(in_features, out_features, bias)

    def row(self, in_features: int, out_features: int) -> nn.Module:
        return self.base.row(in_features, out_features)

    def embedding(self, vocab_size: int, hidden_size: int) -> nn.Module:
        return self.base.embedding(vocab_size, hidden_size)

    def lm_head(self, hidden_size: int, vocab_size: int) -> nn.Module:
        return self.base.lm_head(hidden_size, vocab_size)

    def rotary(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int) -> RotaryEmbedding:
        return self.base.rotary(head_dim, theta, scaling, max_positions)
