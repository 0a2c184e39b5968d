"""Lesson 11 on GPUs: every expert of a mixture-of-experts layer in two kernel launches.

The reference path (:func:`minisgl.layers.moe.reference_moe`) loops over the experts: a few
small matmuls per expert, and a host sync to learn which experts are used. On a GPU that is
dozens of launches per layer, each too small to keep the device busy, and a CUDA graph cannot
capture the sync. The fused path instead:

1. **groups the token slots by expert** (:func:`group_by_expert`, plain torch ops, no host
   sync): each of the ``T * k`` slots (token ``t``'s ``j``-th expert is slot ``t * k + j``) is
   placed in a list sorted by expert, and each expert's run is padded to a multiple of
   ``BLOCK_M`` with an invalid slot, so that every block of ``BLOCK_M`` rows belongs to one
   expert;
2. runs **one kernel for gate/up** over all blocks at once: a program takes one block (one
   expert, up to ``BLOCK_M`` tokens) and one tile of the intermediate features, multiplies the
   tokens' rows of ``x`` with that expert's gate and up rows, and writes
   ``silu(gate) * up`` for each slot: ``[T * k, I]``;
3. runs **one kernel for down**: the same blocks, ``[T * k, I] @ down_proj[e].T``, each row
   scaled by its routing weight inside the kernel: ``[T * k, hidden]``;
4. sums each token's ``k`` rows in float32 and rounds once (a third small launch).

Every shape depends only on ``T`` (the number of blocks is bounded by
``cdiv(T * k, BLOCK_M) + min(E, T * k)``), so a decode step with this path can be captured in a
CUDA graph. An expert no token chose is never read: a step reads the weights of the experts it
touches, which is what its bytes bound counts (``python -m benchmarks moe``).

A decode step (up to ``GEMV_MAX_TOKENS`` tokens) takes a shorter road, :func:`fused_moe_gemv`
and :func:`route`: no grouping, and the small last steps (the top-k sum; the router's softmax
and top-k) are done inside the kernel before them by **the last program to finish**: each
program stores its part, counts itself in on an arrival counter, and the one that arrives last
reads every part back and finishes the job (the pattern of lesson 8's fused decode attention).
A bs=1 layer is then three launches: router, gate/up, down. The router also takes the pre-norm
step before the MLP (:func:`route_normed`: the residual add and RMSNorm, the normed rows stored for
the experts), so the layer's own norm kernel is gone too; and each of these kernels launches with
lesson 8's programmatic dependent launch (:func:`~minisgl.layers.decode_kernels.pdl`).
"""

from __future__ import annotations

__lesson__ = 11

import functools
from dataclasses import dataclass

import torch

from minisgl.utils import cdiv

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU machines
    triton = None

if triton is not None:
    from minisgl.layers.decode_kernels import add_rms_norm, pdl, pdl_launch_early, pdl_launch_late, pdl_wait

BLOCK_M = 16  # token slots per block: the smallest tile tl.dot takes; decode has ~1 token per expert


@dataclass(frozen=True)
class Tiles:
    """One launch's tiles: ``block_n`` output features and ``block_k`` reduced features per step
    of a program, with ``num_warps`` and ``num_stages`` (Triton's software pipelining)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


GATE_UP_TILES = Tiles(32, 128)  # tiles of I (output) and hidden (reduced) in the gate/up kernel
DOWN_TILES = Tiles(64, 128)  # tiles of hidden (output) and I (reduced) in the down kernel
SUM_BLOCK = 1024  # hidden features per program when a token's k rows are summed
# Decode: at most this many tokens take the matrix-vector path (no grouping, no tensor cores).
# Measured on an H200 with the Qwen3-30B-A3B layer (`python -m benchmarks moe --decode --gemv-tiles`,
# moe_gemv_tiles_c8dbf5a_h200.json, the moe_h200.json of c8dbf5a): 25.6 vs 31.9 µs at bs=1, 82 vs 90
# at bs=4, and 150 vs 132 at bs=8
# (shared experts re-read). The tiles are that run's best: gate/up reads one whole row of the
# gate and of the up matrix per program (2,048 features), down 32 x 256; the router 2 experts x
# 2,048 features, one warp (4.9 µs in a graph, the whole router).
GEMV_MAX_TOKENS = 4
GEMV_GATE_UP_TILES = Tiles(1, 2048, num_warps=2)  # intermediate x hidden features per step, one slot per program
GEMV_DOWN_TILES = Tiles(32, 256, num_warps=4)  # hidden x intermediate features per step, one slot per program
ROUTER_TILES = Tiles(2, 2048, num_warps=1)  # experts x hidden features per step of the decode router
# Arrival counters per device (int32, zero between launches): one per (token, tile of hidden
# features) of the decode down projection, one per token of the decode router.
ARRIVAL_COUNTERS = 1 << 15


@functools.cache
def fused_moe_available() -> bool:
    """Triton and a CUDA device: the fused path can run."""
    return triton is not None and torch.cuda.is_available()


def max_blocks(num_slots: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """An upper bound on the padded blocks of ``num_slots`` slots over ``num_experts`` experts:
    each used expert pads at most one partial block, and at most ``num_slots`` experts are used."""
    return cdiv(num_slots, block_m) + min(num_experts, num_slots)


def group_by_expert(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """Token slots grouped by expert, in blocks of ``block_m`` that each belong to one expert.

    ``ids [T, k]`` (int64): each token's experts. Returns ``(slots, block_expert)``:

    * ``slots [max_blocks * block_m]`` (int32): slot numbers ``t * k + j``, sorted by expert
      (ties by slot), each expert's run starting at a multiple of ``block_m``; padding and the
      unused tail hold ``T * k`` (an invalid slot);
    * ``block_expert [max_blocks]`` (int32): the expert of each block, ``num_experts`` for a
      block past the end (its program does nothing).

    No host sync (graph-capturable): every shape follows from ``ids.shape``.
    """
    num_slots = ids.numel()
    flat = ids.reshape(-1)
    device = flat.device
    order = torch.argsort(flat, stable=True)  # [T * k] slots by expert
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync for its size
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)  # [E] where each expert's padded run ends
    run_start = torch.cumsum(counts, 0) - counts  # [E] where each expert's run starts unpadded
    expert_of = flat[order]  # [T * k] the expert of each sorted slot
    rank = torch.arange(num_slots, device=device) - run_start[expert_of]  # its place in its expert's run
    dest = padded_end[expert_of] - padded[expert_of] + rank
    blocks = max_blocks(num_slots, num_experts, block_m)
    slots = torch.full((blocks * block_m,), num_slots, dtype=torch.int32, device=device)
    slots[dest] = order.to(torch.int32)
    starts = torch.arange(blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, starts, right=True).to(torch.int32)  # E past the end
    return slots, block_expert


def fused_topk(logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's softmax (float32) -> top-k -> optional renormalisation in one launch, one
    program per token: ``logits [T, E]`` -> ``(weights [T, k]`` in ``dtype``, ``ids [T, k]``
    int64), largest first (what :class:`~minisgl.layers.moe.Router` computes from its logits)."""
    num_tokens, num_experts = logits.shape
    logits = logits.contiguous()
    weights = torch.empty(num_tokens, top_k, dtype=dtype, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=logits.device)
    _topk_kernel[(num_tokens,)](logits, weights, ids, num_experts, logits.stride(0),
                                TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_E=triton.next_power_of_2(num_experts))
    return weights, ids


@functools.cache
def _arrivals(device: torch.device) -> torch.Tensor:
    """The device's arrival counters (``ARRIVAL_COUNTERS`` int32, zeroed once). A kernel that
    uses them leaves them at zero, so every later launch, eager or replayed, finds them so.
    Allocated on first use: the eager warm-up before a graph capture."""
    return torch.zeros(ARRIVAL_COUNTERS, dtype=torch.int32, device=device)


def arrival_counters(device: torch.device, needed: int) -> torch.Tensor:
    """``needed`` of the device's arrival counters (at most ``ARRIVAL_COUNTERS``)."""
    if needed > ARRIVAL_COUNTERS:
        raise ValueError(f"{needed} arrival counters needed, ARRIVAL_COUNTERS is {ARRIVAL_COUNTERS}")
    return _arrivals(torch.device(device))


def route(x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool,
          tiles: Tiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router on a GPU: ``x [T, hidden]``, ``weight [E, hidden]`` -> ``(weights [T, k]`` in
    ``x``'s dtype, ``ids [T, k]`` int64), what :class:`~minisgl.layers.moe.Router` computes.

    Up to ``GEMV_MAX_TOKENS`` tokens (decode) in **one** launch: a program per (token, tile of
    ``tiles.block_n`` experts) computes its logits (float32 sums, rounded to ``x``'s dtype as
    ``F.linear`` rounds them) and stores them; the last program of a token to arrive runs the
    softmax and top-k of :func:`fused_topk` over all of them. More tokens: ``F.linear`` (cuBLAS)
    and :func:`fused_topk`."""
    tiles = tiles or ROUTER_TILES  # read at the call: a benchmark may set it after a sweep
    num_tokens, hidden = x.shape
    if not 0 < num_tokens <= GEMV_MAX_TOKENS or x.stride(-1) != 1 or weight.stride(-1) != 1:
        return fused_topk(torch.nn.functional.linear(x, weight), top_k, renormalize, x.dtype)
    return _route_launch(x, weight, top_k, renormalize, tiles, min(tiles.block_k, triton.next_power_of_2(hidden)))


def _route_launch(x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool, tiles: Tiles, block_k: int,
                  normed: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode router's one launch (:func:`route`; with ``normed = (residual or None,
    norm_weight, x_out, residual_out, eps)`` the pre-norm step first, :func:`route_normed`):
    ``(weights [T, k], ids [T, k])``."""
    num_tokens, hidden = x.shape
    num_experts = weight.shape[0]
    block_e = triton.next_power_of_2(num_experts)
    logits = torch.empty(num_tokens, block_e, dtype=torch.float32, device=x.device)
    weights = torch.empty(num_tokens, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=x.device)
    residual, norm_weight, x_out, residual_out, eps = normed or (None, x, x, x, 0.0)
    mode = pdl(x)
    _router_topk_kernel[(num_tokens, cdiv(num_experts, tiles.block_n))](
        x, weight, logits, arrival_counters(x.device, num_tokens), weights, ids, num_experts, hidden,
        x.stride(0), weight.stride(0), x if residual is None else residual, norm_weight, x_out, residual_out, eps,
        TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_N=tiles.block_n, BLOCK_K=block_k, BLOCK_E=block_e,
        NORM=normed is not None, ADD=residual is not None, PDL=mode, launch_pdl=mode > 0, num_warps=tiles.num_warps)
    return weights, ids


def route_normed(h: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                 weight: torch.Tensor, top_k: int, renormalize: bool,
                 tiles: Tiles | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The pre-norm step before a mixture-of-experts MLP and its router, in :func:`route`'s one
    decode launch: ``residual <- h + residual`` (rounded to ``h``'s dtype; None: the stream starts
    at ``h``), ``x = rmsnorm(residual)`` rounded as Hugging Face rounds it, then ``route(x)``.
    Every program normalises its token's whole row itself (``hidden`` numbers, one chunk of the
    router's tile); the token's first program stores ``x`` and the new residual for the experts
    and the next layer. Returns ``(weights [T, k], ids [T, k], x [T, hidden], residual [T,
    hidden])``, or None where the one-launch router does not run (more than ``GEMV_MAX_TOKENS``
    tokens, strided rows, or rows wider than one chunk): then the caller norms and routes
    separately. Inputs are not written."""
    tiles = tiles or ROUTER_TILES
    num_tokens, hidden = h.shape
    rows_ok = h.is_contiguous() and (residual is None or residual.is_contiguous())
    if not 0 < num_tokens <= GEMV_MAX_TOKENS or not rows_ok or weight.stride(-1) != 1 \
            or triton.next_power_of_2(hidden) > tiles.block_k:
        return None
    if norm_weight.shape != (hidden,) or (residual is not None and residual.shape != h.shape):
        raise ValueError(f"route_normed: norm weight {tuple(norm_weight.shape)} and residual "
                         f"{None if residual is None else tuple(residual.shape)} do not fit h {tuple(h.shape)}")
    x = torch.empty_like(h)
    new_residual = h if residual is None else torch.empty_like(h)
    weights, ids = _route_launch(h, weight, top_k, renormalize, tiles, triton.next_power_of_2(hidden),
                                 (residual, norm_weight, x, new_residual, eps))
    return weights, ids, x, new_residual


def group_by_expert_fused(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M,
                          first_expert: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`group_by_expert` in one Triton launch (a dozen torch kernels cost a bs=1 decode
    step more than the expert matmuls). Same outputs, except that an expert's slots may come in
    any order within its run (atomics place them; each row is computed on its own, so the
    results do not depend on it). Under expert parallelism ``ids`` are global and this rank
    holds experts ``first_expert .. first_expert + num_experts - 1``: the slots of other ranks'
    experts are left out (no block holds them)."""
    num_slots = ids.numel()
    blocks = max_blocks(num_slots, num_experts, block_m)
    slots = torch.empty(blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    block_e = triton.next_power_of_2(num_experts)
    scratch = torch.empty(3 * block_e, dtype=torch.int32, device=ids.device)  # counts, cursors, run starts
    _group_kernel[(1,)](ids.reshape(-1), slots, block_expert, scratch, num_slots, num_experts, first_expert, blocks,
                        BLOCK_M=block_m, BLOCK_S=min(1024, triton.next_power_of_2(max(num_slots, 16))),
                        BLOCK_E=block_e, BLOCK_B=max(16, 4096 // block_e))
    return slots, block_expert


def fused_moe(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor, gate_up_tiles: Tiles = GATE_UP_TILES,
              down_tiles: Tiles = DOWN_TILES, first_expert: int = 0, path: str = "auto") -> torch.Tensor:
    """The same as :func:`~minisgl.layers.moe.reference_moe`, in two kernel launches.

    ``x [T, hidden]``; ``gate_up_proj [E, 2I, hidden]`` (gate rows, then up rows);
    ``down_proj [E, hidden, I]``; ``weights [T, k]``, ``ids [T, k]``. Returns ``[T, hidden]``
    in ``x``'s dtype. Needs Triton (a CUDA device, or ``TRITON_INTERPRET=1`` on the CPU).

    Expert parallelism (lesson 11): the ``E`` experts given are global experts
    ``first_expert .. first_expert + E - 1`` and ``ids`` are global; a token's slots routed to
    another rank's experts add nothing here (that rank adds them; the all-reduce sums the parts).

    ``path``: ``"grouped"`` (the blocks above), ``"gemv"`` (:func:`fused_moe_gemv`) or
    ``"auto"``: the matrix-vector path up to ``GEMV_MAX_TOKENS`` tokens (decode), else grouped.
    """
    if path == "gemv" or (path == "auto" and x.shape[0] <= GEMV_MAX_TOKENS):
        return fused_moe_gemv(x, gate_up_proj, down_proj, weights, ids, first_expert=first_expert)
    if path not in ("auto", "grouped"):
        raise ValueError(f"path must be 'auto', 'grouped' or 'gemv', not {path!r}")
    gu, dn = gate_up_tiles, down_tiles
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    top_k = ids.shape[1]
    num_slots = num_tokens * top_k
    x = x.contiguous()
    slots, block_expert = group_by_expert_fused(ids, num_experts, first_expert=first_expert)
    blocks = block_expert.numel()
    act = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)  # silu(gate) * up, per slot
    _gate_up_kernel[(blocks, cdiv(inter, gu.block_n))](
        x, gate_up_proj, act, slots, block_expert, num_slots, num_experts, top_k, inter, hidden,
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), gate_up_proj.stride(2), act.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=gu.block_n, BLOCK_K=gu.block_k, num_warps=gu.num_warps, num_stages=gu.num_stages)
    rows = torch.empty(num_slots, hidden, dtype=torch.float32, device=x.device)  # weighted expert outputs
    _down_kernel[(blocks, cdiv(hidden, dn.block_n))](
        act, down_proj, rows, slots, block_expert, weights.contiguous(), num_slots, num_experts, hidden, inter,
        act.stride(0), down_proj.stride(0), down_proj.stride(1), down_proj.stride(2), rows.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=dn.block_n, BLOCK_K=dn.block_k, num_warps=dn.num_warps, num_stages=dn.num_stages)
    return _sum_top_k(rows, ids, x, first_expert, num_experts)


def _sum_top_k(rows: torch.Tensor, ids: torch.Tensor, like: torch.Tensor, first_expert: int,
               num_experts: int) -> torch.Tensor:
    """The grouped form's last launch: each token's ``k`` weighted rows (``rows [T * k, hidden]``,
    float32) summed in slot order over this rank's experts, rounded once to ``like``'s dtype."""
    num_tokens, hidden = like.shape
    out = torch.empty_like(like)
    _sum_top_k_kernel[(num_tokens, cdiv(hidden, SUM_BLOCK))](rows, out, ids.reshape(-1), hidden, first_expert,
                                                             num_experts, TOP_K=ids.shape[1], BLOCK=SUM_BLOCK)
    return out


def fused_moe_gemv(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                   weights: torch.Tensor, ids: torch.Tensor, first_expert: int = 0,
                   gate_up_tiles: Tiles | None = None, down_tiles: Tiles | None = None) -> torch.Tensor:
    """:func:`fused_moe` for a few tokens (decode), with no grouping launch.

    At bs=1 each of a token's ``k`` slots has its own expert, so there is nothing to group, and
    a block of ``BLOCK_M`` rows would hold one real row: the grouping launch and the padded
    tensor-core tiles are overhead there. Here one program computes one slot's
    ``silu(gate) * up`` for a tile of features straight from ``ids`` (``[T * k, I]``), one
    program one slot's weighted down projection for a tile of hidden features (``[T * k,
    hidden]``, float32), and the last of a token's ``k`` programs of a tile to finish adds their
    rows, in slot order, as the grouped path's top-k sum does (same float32 sums, same
    result). Two tokens that
    chose the same expert read its weights twice, which is why the grouped path takes over above
    ``GEMV_MAX_TOKENS`` tokens. Shapes and expert parallelism as in :func:`fused_moe`.
    """
    gu, dn = gate_up_tiles or GEMV_GATE_UP_TILES, down_tiles or GEMV_DOWN_TILES
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    top_k = ids.shape[1]
    num_slots = num_tokens * top_k
    x, ids = x.contiguous(), ids.contiguous()
    act = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)  # silu(gate) * up, per slot
    mode = pdl(x)
    _gate_up_gemv_kernel[(num_slots, cdiv(inter, gu.block_n))](
        x, gate_up_proj, act, ids, first_expert, num_experts, top_k, inter, hidden,
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), gate_up_proj.stride(2), act.stride(0),
        BLOCK_N=gu.block_n, BLOCK_K=gu.block_k, PDL=mode, launch_pdl=mode > 0, num_warps=gu.num_warps,
        num_stages=gu.num_stages)
    rows = torch.empty(num_slots, hidden, dtype=torch.float32, device=x.device)  # weighted expert outputs
    out = torch.empty_like(x)
    hidden_tiles = cdiv(hidden, dn.block_n)
    _down_gemv_sum_kernel[(num_slots, hidden_tiles)](
        act, down_proj, rows, out, arrival_counters(x.device, num_tokens * hidden_tiles), ids,
        weights.contiguous(), first_expert, num_experts, hidden, inter,
        act.stride(0), down_proj.stride(0), down_proj.stride(1), down_proj.stride(2),
        TOP_K=top_k, BLOCK_N=dn.block_n, BLOCK_K=dn.block_k, PDL=mode, launch_pdl=mode > 0, num_warps=dn.num_warps,
        num_stages=dn.num_stages)
    return out


if triton is not None:

    @triton.jit
    def _softmax_top_k(z, experts, ok, weights_ptr, ids_ptr, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
                       BLOCK_E: tl.constexpr):
        """One token's routing from its float32 logits ``z [BLOCK_E]`` (``ok``: real experts):
        softmax, the ``TOP_K`` largest probabilities (ties: the lower expert id), then the
        optional renormalisation; stored at ``weights_ptr`` / ``ids_ptr``, largest first.

        One reduction per choice: each expert's key holds its probability's bits above (a
        non-negative float orders like its bits as an integer) and ``BLOCK_E - 1 - expert``
        below, so the largest key is the largest probability, the lowest id among equals."""
        p = tl.exp(z - tl.max(z, axis=0))
        p = p / tl.sum(p, axis=0)
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - experts).to(tl.int64)
        key = tl.where(ok, key, -1)
        TOP_K_PAD: tl.constexpr = triton.next_power_of_2(TOP_K)
        choice = tl.arange(0, TOP_K_PAD)
        chosen_p = tl.zeros((TOP_K_PAD,), dtype=tl.float32)
        chosen_id = tl.zeros((TOP_K_PAD,), dtype=tl.int64)
        for j in tl.static_range(TOP_K):
            best = tl.max(key, axis=0)
            expert = BLOCK_E - 1 - (best & 0xFFFFFFFF)
            prob = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            chosen_p = tl.where(choice == j, prob, chosen_p)
            chosen_id = tl.where(choice == j, expert, chosen_id)
            key = tl.where(experts == expert, -1, key)
        if RENORMALIZE:
            chosen_p = chosen_p / tl.sum(chosen_p, axis=0)
        tl.store(ids_ptr + choice, chosen_id, mask=choice < TOP_K)
        tl.store(weights_ptr + choice, chosen_p.to(weights_ptr.dtype.element_ty), mask=choice < TOP_K)

    @triton.jit
    def _topk_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, stride_t,
                     TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr):
        """One token: :func:`_softmax_top_k` of its logits."""
        t = tl.program_id(0).to(tl.int64)
        experts = tl.arange(0, BLOCK_E)
        ok = experts < num_experts
        z = tl.load(logits_ptr + t * stride_t + experts, mask=ok, other=float("-inf")).to(tl.float32)
        _softmax_top_k(z, experts, ok, weights_ptr + t * TOP_K, ids_ptr + t * TOP_K, TOP_K, RENORMALIZE, BLOCK_E)

    @triton.jit
    def _router_kernel_input(x_ptr, res_ptr, norm_w_ptr, x_out_ptr, res_out_ptr, t, stride_xt, cols, hidden, eps,
                             NORM: tl.constexpr, ADD: tl.constexpr):
        """Token ``t``'s chunk ``cols`` of the router's input (float32): ``x``, or with ``NORM``
        ``rmsnorm(x (+ residual))`` over the whole row (one chunk; lesson 8's ``add_rms_norm``),
        which the token's first program stores at ``x_out`` (and the sum at ``res_out`` with ``ADD``)."""
        if NORM:
            first = tl.program_id(1) == 0
            a = add_rms_norm(x_ptr + t * stride_xt, res_ptr + t * hidden, norm_w_ptr, res_out_ptr + t * hidden, cols,
                             hidden, eps, first, False, ADD)
            if first:
                tl.store(x_out_ptr + t * hidden + cols, a.to(x_out_ptr.dtype.element_ty), mask=cols < hidden)
            return a
        return tl.load(x_ptr + t * stride_xt + cols, mask=cols < hidden, other=0.0).to(tl.float32)

    @triton.jit
    def _router_weights(w_ptr, rows, r_ok, cols, hidden, stride_we):
        return tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_we + cols[None, :],
                       mask=r_ok[:, None] & (cols < hidden)[None, :], other=0.0)

    @triton.jit
    def _router_topk_kernel(x_ptr, w_ptr, logits_ptr, arrivals_ptr, weights_ptr, ids_ptr, num_experts, hidden,
                            stride_xt, stride_we, res_ptr, norm_w_ptr, x_out_ptr, res_out_ptr, eps,
                            TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, NORM: tl.constexpr, ADD: tl.constexpr,
                            PDL: tl.constexpr):
        """One token x ``BLOCK_N`` experts: their logits ``x[t] . w[e]`` (float32 sums, rounded to
        ``x``'s dtype), stored in ``logits [T, BLOCK_E]``; the token's last program to arrive
        routes it (:func:`_softmax_top_k`) and resets the token's counter. With ``NORM`` the
        router's input is the pre-norm step's output (:func:`_router_kernel_input`, see
        :func:`route_normed`). With ``PDL`` the first chunk of the router's weights is loaded
        before waiting for the previous kernel."""
        pdl_launch_early(PDL)
        t = tl.program_id(0).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        r_ok = rows < num_experts
        cols = tl.arange(0, BLOCK_K)
        w = _router_weights(w_ptr, rows, r_ok, cols, hidden, stride_we)
        pdl_wait(PDL)  # x is the previous kernel's output
        a = _router_kernel_input(x_ptr, res_ptr, norm_w_ptr, x_out_ptr, res_out_ptr, t, stride_xt, cols, hidden, eps,
                                 NORM, ADD)
        acc = w.to(tl.float32) * a[None, :]
        for k0 in range(BLOCK_K, hidden, BLOCK_K):  # (NORM: none, the row is one chunk)
            cols = k0 + tl.arange(0, BLOCK_K)
            w = _router_weights(w_ptr, rows, r_ok, cols, hidden, stride_we)
            a = _router_kernel_input(x_ptr, res_ptr, norm_w_ptr, x_out_ptr, res_out_ptr, t, stride_xt, cols, hidden,
                                     eps, NORM, ADD)
            acc += w.to(tl.float32) * a[None, :]
        logit = tl.sum(acc, axis=1).to(x_ptr.dtype.element_ty).to(tl.float32)
        pdl_launch_late(PDL)
        tl.store(logits_ptr + t * BLOCK_E + rows, logit, mask=r_ok)
        tl.debug_barrier()  # every thread's stores are made before the arrival below
        arrived = tl.atomic_add(arrivals_ptr + t, 1, sem="acq_rel")
        if arrived == tl.num_programs(1) - 1:  # the token's last program: every logit is stored
            experts = tl.arange(0, BLOCK_E)
            ok = experts < num_experts  # .cg: read from L2, where the other SMs wrote
            z = tl.load(logits_ptr + t * BLOCK_E + experts, mask=ok, other=float("-inf"), cache_modifier=".cg")
            _softmax_top_k(z, experts, ok, weights_ptr + t * TOP_K, ids_ptr + t * TOP_K, TOP_K, RENORMALIZE, BLOCK_E)
            tl.atomic_xchg(arrivals_ptr + t, 0)  # ready for the next launch

    @triton.jit
    def _group_kernel(ids_ptr, slots_ptr, block_expert_ptr, scratch_ptr, num_slots, num_experts, first_expert,
                      num_blocks, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr,
                      BLOCK_B: tl.constexpr):
        """One program: count the slots per expert, pad each expert's run to whole blocks, place
        every slot in its expert's run, and name each block's expert (``num_experts`` past the end).
        ``scratch [3 * BLOCK_E]``: counts, placement cursors, run starts (zeroed here first).
        Experts are ``ids - first_expert``; a slot outside ``0 .. num_experts - 1`` (another
        rank's expert) is skipped."""
        counts_ptr = scratch_ptr
        cursor_ptr = scratch_ptr + BLOCK_E
        start_ptr = scratch_ptr + 2 * BLOCK_E
        zeros = tl.zeros((BLOCK_E,), dtype=tl.int32)
        tl.store(counts_ptr + tl.arange(0, BLOCK_E), zeros)
        tl.store(cursor_ptr + tl.arange(0, BLOCK_E), zeros)
        tl.debug_barrier()
        total = num_blocks * BLOCK_M
        for p0 in range(0, total, BLOCK_S):  # every position padding until a slot lands there
            offs = p0 + tl.arange(0, BLOCK_S)
            tl.store(slots_ptr + offs, tl.zeros((BLOCK_S,), dtype=tl.int32) + num_slots, mask=offs < total)
        for s0 in range(0, num_slots, BLOCK_S):
            offs = s0 + tl.arange(0, BLOCK_S)
            expert = tl.load(ids_ptr + offs, mask=offs < num_slots, other=0) - first_expert
            ok = (offs < num_slots) & (expert >= 0) & (expert < num_experts)
            expert = tl.where(ok, expert, 0)
            tl.atomic_add(counts_ptr + expert, tl.full((BLOCK_S,), 1, tl.int32), mask=ok)
        tl.debug_barrier()
        experts = tl.arange(0, BLOCK_E)
        counts = tl.load(counts_ptr + experts, mask=experts < num_experts, other=0)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        end = tl.cumsum(padded, 0)  # where each expert's padded run ends
        tl.store(start_ptr + experts, end - padded, mask=experts < num_experts)
        tl.debug_barrier()
        for s0 in range(0, num_slots, BLOCK_S):
            offs = s0 + tl.arange(0, BLOCK_S)
            expert = tl.load(ids_ptr + offs, mask=offs < num_slots, other=0) - first_expert
            ok = (offs < num_slots) & (expert >= 0) & (expert < num_experts)
            expert = tl.where(ok, expert, 0)
            start = tl.load(start_ptr + expert, mask=ok, other=0)
            rank = tl.atomic_add(cursor_ptr + expert, tl.full((BLOCK_S,), 1, tl.int32), mask=ok)
            tl.store(slots_ptr + start + rank, offs.to(tl.int32), mask=ok)
        real = experts < num_experts
        for b0 in range(0, num_blocks, BLOCK_B):
            b = b0 + tl.arange(0, BLOCK_B)
            before = (end[None, :] <= (b * BLOCK_M)[:, None]) & real[None, :]  # [BLOCK_B, BLOCK_E]
            tl.store(block_expert_ptr + b, tl.sum(before.to(tl.int32), axis=1), mask=b < num_blocks)

    @triton.jit
    def _gate_up_kernel(x_ptr, w_ptr, out_ptr, slots_ptr, block_expert_ptr, num_slots, num_experts, top_k, inter,
                        hidden, stride_xt, stride_we, stride_wn, stride_wk, stride_ot,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One block of slots (one expert) x one tile of ``BLOCK_N`` intermediate features:
        ``out[slot, n] = silu(x[t] . gate[e, n]) * (x[t] . up[e, n])`` with ``t = slot // top_k``."""
        block = tl.program_id(0)
        expert = tl.load(block_expert_ptr + block)
        if expert < num_experts:
            slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
            valid = slots < num_slots
            token = tl.where(valid, slots // top_k, 0)
            offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < inter
            w_expert = w_ptr + expert.to(tl.int64) * stride_we
            gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < hidden
                a = tl.load(x_ptr + token[:, None].to(tl.int64) * stride_xt + offs_k[None, :],
                            mask=valid[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
                w_mask = k_ok[:, None] & n_ok[None, :]
                w_gate = tl.load(w_expert + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                                 mask=w_mask, other=0.0)  # [BLOCK_K, BLOCK_N]
                w_up = tl.load(w_expert + (inter + offs_n)[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                               mask=w_mask, other=0.0)
                gate += tl.dot(a, w_gate)
                up += tl.dot(a, w_up)
            act = gate * tl.sigmoid(gate) * up
            tl.store(out_ptr + slots[:, None].to(tl.int64) * stride_ot + offs_n[None, :],
                     act.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _down_kernel(act_ptr, w_ptr, out_ptr, slots_ptr, block_expert_ptr, weights_ptr, num_slots, num_experts,
                     hidden, inter, stride_at, stride_we, stride_wn, stride_wk, stride_ot,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One block of slots (one expert) x one tile of ``BLOCK_N`` hidden features:
        ``out[slot, n] = weight[slot] * (act[slot] . down[e, n])``, in float32."""
        block = tl.program_id(0)
        expert = tl.load(block_expert_ptr + block)
        if expert < num_experts:
            slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
            valid = slots < num_slots
            safe = tl.where(valid, slots, 0).to(tl.int64)
            offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < hidden
            w_expert = w_ptr + expert.to(tl.int64) * stride_we
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, inter, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < inter
                a = tl.load(act_ptr + safe[:, None] * stride_at + offs_k[None, :],
                            mask=valid[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
                w = tl.load(w_expert + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                            mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
                acc += tl.dot(a, w)
            weight = tl.load(weights_ptr + safe, mask=valid, other=0.0).to(tl.float32)
            acc = acc * weight[:, None]
            tl.store(out_ptr + safe[:, None] * stride_ot + offs_n[None, :], acc, mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _gate_up_gemv_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, first_expert, num_experts, top_k, inter, hidden,
                             stride_xt, stride_we, stride_wn, stride_wk, stride_ot,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """One slot x one tile of ``BLOCK_N`` intermediate features, without tensor cores (one
        token's row is a matrix-vector product): ``out[slot, n] = silu(x[t] . gate[e, n]) *
        (x[t] . up[e, n])``, ``t = slot // top_k``, ``e = ids[slot] - first_expert``; a slot of
        another rank's expert is skipped (its row is never read). The products accumulate in a
        ``[BLOCK_N, BLOCK_K]`` tile, reduced across the threads once at the end. With ``PDL``
        nothing is loaded before the previous kernel (the router) has finished: which expert's
        rows to read is its output. Even with ``PDL_EARLY`` a program lets the next kernel (the
        down projection) launch only **after** its wait: so once that kernel runs, the router
        has finished, and it may read the router's choices before its own wait."""
        pdl_wait(PDL)  # every program, a slot of another rank's expert too (see decode_kernels.pdl)
        pdl_launch_early(PDL)
        slot = tl.program_id(0).to(tl.int64)
        expert = tl.load(ids_ptr + slot) - first_expert
        if (expert >= 0) & (expert < num_experts):
            token = slot // top_k
            offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < inter
            w_expert = w_ptr + expert * stride_we
            gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < hidden
                a = tl.load(x_ptr + token * stride_xt + offs_k, mask=k_ok, other=0.0).to(tl.float32)  # [BLOCK_K]
                w_mask = n_ok[:, None] & k_ok[None, :]
                w_gate = tl.load(w_expert + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                                 mask=w_mask, other=0.0)  # [BLOCK_N, BLOCK_K]
                w_up = tl.load(w_expert + (inter + offs_n)[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                               mask=w_mask, other=0.0)
                gate += w_gate.to(tl.float32) * a[None, :]
                up += w_up.to(tl.float32) * a[None, :]
            pdl_launch_late(PDL)
            g = tl.sum(gate, axis=1)
            act = g * tl.sigmoid(g) * tl.sum(up, axis=1)
            tl.store(out_ptr + slot * stride_ot + offs_n, act.to(out_ptr.dtype.element_ty), mask=n_ok)

    @triton.jit
    def _down_gemv_sum_kernel(act_ptr, w_ptr, rows_ptr, out_ptr, arrivals_ptr, ids_ptr, weights_ptr, first_expert,
                              num_experts, hidden, inter, stride_at, stride_we, stride_wn, stride_wk,
                              TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """One slot x one tile of ``BLOCK_N`` hidden features: ``rows[slot, n] = weight[slot] *
        (act[slot] . down[e, n])`` in float32 (what the grouped down kernel writes), for a slot of
        this rank's experts. Every program then counts itself in on its (token, tile)'s counter;
        the ``TOP_K``-th to arrive adds the token's rows of this rank's experts in slot order
        (:func:`_sum_top_k_kernel`'s sum), stores ``out[t, tile]`` and resets the counter.

        With ``PDL`` the slot's expert and the first chunk of its weights are loaded before the
        wait: the gate/up kernel before this one lets it launch only after that kernel's own
        wait, when the router (which wrote ``ids``) has finished; only ``act`` is the previous
        kernel's output. ``ids`` is read from L2 (``.cg``), where the router wrote it."""
        pdl_launch_early(PDL)
        slot = tl.program_id(0).to(tl.int64)
        tile = tl.program_id(1)
        token = slot // TOP_K
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hidden
        expert = tl.load(ids_ptr + slot, cache_modifier=".cg") - first_expert
        mine = (expert >= 0) & (expert < num_experts)  # a slot of this rank's experts
        w_expert = w_ptr + tl.where(mine, expert, 0) * stride_we
        offs_k = tl.arange(0, BLOCK_K)
        k_ok = offs_k < inter
        rows_mine = (tl.zeros((BLOCK_N,), dtype=tl.int32) + mine.to(tl.int32)) != 0  # (a vector mask)
        w_first = tl.load(w_expert + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                          mask=(rows_mine & n_ok)[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
        pdl_wait(PDL)  # every program (a slot of another rank's expert too: see decode_kernels.pdl)
        if mine:
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            a = tl.load(act_ptr + slot * stride_at + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            acc += w_first.to(tl.float32) * a[None, :]
            for k0 in range(BLOCK_K, inter, BLOCK_K):  # the other chunks
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < inter
                a = tl.load(act_ptr + slot * stride_at + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                w = tl.load(w_expert + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                            mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
                acc += w.to(tl.float32) * a[None, :]
            pdl_launch_late(PDL)
            row = tl.sum(acc, axis=1) * tl.load(weights_ptr + slot).to(tl.float32)
            tl.store(rows_ptr + slot * hidden + offs_n, row, mask=n_ok)
        tl.debug_barrier()  # every thread's stores are made before the arrival below
        counter = arrivals_ptr + token * tl.num_programs(1) + tile
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == TOP_K - 1:  # the token's last slot of this tile: every row is stored
            total = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for j in tl.static_range(TOP_K):
                chosen = tl.zeros((BLOCK_N,), dtype=tl.int64) + (tl.load(ids_ptr + token * TOP_K + j) - first_expert)
                held = (chosen >= 0) & (chosen < num_experts)  # slot j's expert is this rank's (a vector mask)
                total += tl.load(rows_ptr + (token * TOP_K + j) * hidden + offs_n, mask=n_ok & held, other=0.0,
                                 cache_modifier=".cg")  # .cg: read from L2, where the other SMs wrote
            tl.store(out_ptr + token * hidden + offs_n, total.to(out_ptr.dtype.element_ty), mask=n_ok)
            tl.atomic_xchg(counter, 0)  # ready for the next launch

    @triton.jit
    def _sum_top_k_kernel(rows_ptr, out_ptr, ids_ptr, hidden, first_expert, num_experts,
                          TOP_K: tl.constexpr, BLOCK: tl.constexpr):
        """``out[t] = sum_j rows[t * TOP_K + j]`` (float32, in slot order) over the slots whose
        expert this rank holds, rounded once to ``out``'s dtype."""
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < hidden
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            expert = tl.zeros((BLOCK,), dtype=tl.int64) + (tl.load(ids_ptr + t * TOP_K + j) - first_expert)
            mine = (expert >= 0) & (expert < num_experts)  # (broadcast over the block: a vector mask)
            acc += tl.load(rows_ptr + (t * TOP_K + j) * hidden + offs, mask=ok & mine, other=0.0)
        tl.store(out_ptr + t * hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)
