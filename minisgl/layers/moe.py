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
and one all-reduce per layer completes it. Under **expert parallelism** (``ep_size == tp_size``)
every rank holds ``E / ep`` *whole* experts instead (rank ``r``: experts ``r * E / ep ..``) and
computes only the choices routed to them; the same one all-reduce adds the ranks' partial sums.
Attention, dense MLPs and Qwen2-MoE's shared expert stay tensor-parallel either way.

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
from minisgl.layers.fused_moe import fused_moe, fused_moe_available, route, route_normed
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
    tokens routed to it; experts no token chose cost nothing. A choice outside ``0 .. E - 1``
    is skipped: under expert parallelism it is another rank's expert (see :class:`Experts`).
    """
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():  # sorted; a host sync on a GPU
        if not 0 <= expert < gate_up_proj.shape[0]:
            continue  # another rank's expert (expert parallelism)
        token, slot = (ids == expert).nonzero(as_tuple=True)  # which tokens chose it, and as which of their k
        gate, up = F.linear(x[token], gate_up_proj[expert]).chunk(2, dim=-1)  # [n, I] each
        y = F.linear(F.silu(gate) * up, down_proj[expert])  # [n, hidden]
        # out[token] += weight * y. (Tensor.index_add_ does the same, but on a busy 2-core CPU with
        # two torch threads it was measured at ~12 ms a call for one row, this at ~2 us.)
        out.index_put_((token,), y * weights[token, slot, None], accumulate=True)
    return out


class Experts(nn.Module):
    """Stacked SwiGLU experts of one layer: ``gate_up_proj [n, 2I, hidden]`` and
    ``down_proj [n, hidden, I]``, the ``n`` experts this rank holds.

    Plain or under tensor parallelism (``tp_size > 1``): all ``n = num_experts`` experts, ``I``
    this rank's slice of each expert's intermediate features. Under expert parallelism
    (``ep_size > 1``, lesson 11): ``n = num_experts / ep_size`` whole experts, global ids
    ``first_expert .. first_expert + n - 1`` with ``first_expert = ep_rank * n``; the router's
    ids are shifted by ``first_expert`` before the lookup, so another rank's experts fall
    outside ``0 .. n - 1`` and are skipped (their tokens' outputs come from that rank, through
    the all-reduce).

    :meth:`checkpoint_pieces` tells the loader where each checkpoint tensor goes, for both
    layouts: the hub's one matrix per expert (``experts.{e}.gate_proj.weight [I, hidden]``, ...)
    and the stacked ``experts.gate_up_proj`` / ``experts.down_proj`` of the layout above. A
    single expert (Qwen2-MoE's shared one) also reads names without the number
    (``shared_expert.gate_proj.weight``).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, tp_size: int = 1,
                 ep_size: int = 1, ep_rank: int = 0) -> None:
        super().__init__()
        if num_experts % ep_size or not 0 <= ep_rank < ep_size or (ep_size > 1 and tp_size > 1):
            raise ValueError(f"{num_experts} experts cannot be split as rank {ep_rank} of ep_size={ep_size} "
                             f"(with tp_size={tp_size}: an expert is split by features or held whole, not both)")
        self.num_experts = num_experts  # in the whole layer (the router's choices)
        self.num_local_experts = num_experts // ep_size  # held by this rank
        self.first_expert = ep_rank * self.num_local_experts
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_local_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(self.num_local_experts, hidden_size, intermediate_size))
        self.intermediate_size = intermediate_size
        self.tp_size = tp_size  # the checkpoint's experts are tp_size times wider

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]``, ``weights [T, k]``, ``ids [T, k]`` (global expert ids) -> this rank's
        part of the layer's output, ``[T, hidden]`` (the whole output without TP or EP)."""
        if x.is_cuda and fused_moe_available():  # every (local) expert in two launches, no host sync
            return fused_moe(x, self.gate_up_proj, self.down_proj, weights, ids, first_expert=self.first_expert)
        local = ids - self.first_expert  # [T, k]: this rank's experts are 0 .. n - 1
        return reference_moe(x, self.gate_up_proj, self.down_proj, weights, local)

    def checkpoint_pieces(self, key: str, tp_rank: int) -> list[tuple[str, tuple, tuple]] | None:
        """Where checkpoint tensor ``key`` (its name below this module, e.g. ``"3.up_proj.weight"``)
        goes: ``(parameter, index into the parameter, index into the checkpoint tensor)`` pieces,
        ``[]`` for another rank's expert, or None for a tensor this module does not know. Under
        TP, rank ``r`` reads rows (gate, up) or columns (down) ``r * I .. (r + 1) * I`` of every
        expert's intermediate features; under EP, its own experts whole."""
        n, every = self.intermediate_size, slice(None)
        rank = tp_rank if self.tp_size > 1 else 0
        mine = slice(rank * n, (rank + 1) * n)  # this rank's intermediate features
        first, local_count = self.first_expert, self.num_local_experts
        experts = slice(first, first + local_count)  # this rank's experts, in the checkpoint
        m = re.fullmatch(r"(?:(\d+)\.)?(gate|up|down)_proj\.weight", key)
        if m:  # the hub's layout: one [I, hidden] (gate, up) or [hidden, I] (down) matrix per expert
            expert, which = int(m[1] or 0), m[2]
            if expert >= self.num_experts or (m[1] is None and self.num_experts != 1):
                return None
            if not first <= expert < first + local_count:
                return []  # another rank's (expert parallelism)
            local = expert - first
            if which == "down":
                return [("down_proj", (local,), (every, mine))]
            half = slice(0, n) if which == "gate" else slice(n, 2 * n)
            return [("gate_up_proj", (local, half), (mine,))]
        if key == "gate_up_proj":  # stacked [E, 2 * I_full, hidden]: gate rows, then up rows
            full = n * self.tp_size
            up = slice(full + mine.start, full + mine.stop)
            return [("gate_up_proj", (every, slice(0, n)), (experts, mine)),
                    ("gate_up_proj", (every, slice(n, 2 * n)), (experts, up))]
        if key == "down_proj":  # stacked [E, hidden, I_full]
            return [("down_proj", (), (experts, every, mine))]
        return None


class SparseMoE(nn.Module):
    """A mixture-of-experts MLP, ``[T, hidden] -> [T, hidden]``: HF's ``mlp`` of a sparse layer
    (``mlp.gate`` the router, ``mlp.experts`` the experts; Qwen2-MoE: ``mlp.shared_expert``, one
    expert every token uses, weighted by ``sigmoid(mlp.shared_expert_gate(x))``). Under TP or EP
    the ranks' partial sums are added once per layer, through ``TPGroup.reduce_later``: here, or
    on GPUs by the pre-norm step after the layer (lesson 9's fused all-reduce + add + RMSNorm;
    the output then only reaches lesson 1's ``add_and_norm``). ``config`` is one rank's
    (``ModelConfig.shard``): under EP, ``moe_intermediate_size`` whole and ``ep_size`` the
    number of ranks that share the experts; the shared expert stays tensor-parallel."""

    def __init__(self, config: ModelConfig, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.tp = tp or get_tp()
        self.gate = Router(config.hidden_size, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob)
        ep = config.ep_size  # 1, or tp_size: whole experts, E / ep on each rank
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size,
                               tp_size=config.tp_size if ep == 1 else 1, ep_size=ep, ep_rank=self.tp.rank if ep > 1 else 0)
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = Experts(1, config.hidden_size, config.shared_expert_intermediate_size, config.tp_size)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)  # whole on every rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and fused_moe_available():  # the router's softmax and top-k fused (decode: its matmul too)
            gate = self.gate
            weights, ids = route(x, gate.weight, gate.top_k, gate.renormalize)
        else:
            weights, ids = self.gate(x)  # [T, k], [T, k]
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:  # every token "routed" to expert 0 of the shared one
            gate = torch.sigmoid(self.shared_expert_gate(x))  # [T, 1]
            out = out + self.shared_expert(x, gate, torch.zeros_like(gate, dtype=torch.int64))
        return self.tp.reduce_later(out)

    def forward_normed(self, norm: nn.Module, h: torch.Tensor,
                       residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(self(norm(h + residual)), h + residual)``, lesson 1's
        :func:`~minisgl.models.model.normed_projection`. For a decode batch on CUDA the pre-norm
        step runs inside the router's one launch (:func:`~minisgl.layers.fused_moe.route_normed`,
        which also hands the normed rows to the experts): one kernel less per layer."""
        if h.is_cuda and fused_moe_available() and self.shared_expert is None:
            gate = self.gate
            routed = route_normed(h, residual, norm.weight, norm.eps, gate.weight, gate.top_k, gate.renormalize)
            if routed is not None:
                weights, ids, x, residual = routed
                return self.tp.reduce_later(self.experts(x, weights, ids)), residual
        x, residual = norm.add_and_norm(h, residual)
        return self(x), residual


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
