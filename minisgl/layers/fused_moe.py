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
4. sums each token's ``k`` rows (``view(T, k, hidden).sum(1)``, in float32).

Every shape depends only on ``T`` (the number of blocks is bounded by
``cdiv(T * k, BLOCK_M) + min(E, T * k)``), so a decode step with this path can be captured in a
CUDA graph. An expert no token chose is never read: a step reads the weights of the experts it
touches, which is what its bytes bound counts (``python -m benchmarks moe``).
"""

from __future__ import annotations

__lesson__ = 11

import functools

import torch

from minisgl.utils import cdiv

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU machines
    triton = None

BLOCK_M = 16  # token slots per block: the smallest tile tl.dot takes; decode has ~1 token per expert
GATE_UP_BLOCK_N, GATE_UP_BLOCK_K = 32, 128  # tiles of I and of hidden in the gate/up kernel
DOWN_BLOCK_N, DOWN_BLOCK_K = 64, 128  # tiles of hidden and of I in the down kernel


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


def fused_moe(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The same as :func:`~minisgl.layers.moe.reference_moe`, in two kernel launches.

    ``x [T, hidden]``; ``gate_up_proj [E, 2I, hidden]`` (gate rows, then up rows);
    ``down_proj [E, hidden, I]``; ``weights [T, k]``, ``ids [T, k]``. Returns ``[T, hidden]``
    in ``x``'s dtype. Needs Triton (a CUDA device, or ``TRITON_INTERPRET=1`` on the CPU).
    """
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    top_k = ids.shape[1]
    num_slots = num_tokens * top_k
    x = x.contiguous()
    slots, block_expert = group_by_expert(ids, num_experts)
    blocks = block_expert.numel()
    act = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)  # silu(gate) * up, per slot
    _gate_up_kernel[(blocks, cdiv(inter, GATE_UP_BLOCK_N))](
        x, gate_up_proj, act, slots, block_expert, num_slots, num_experts, top_k, inter, hidden,
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), gate_up_proj.stride(2), act.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=GATE_UP_BLOCK_N, BLOCK_K=GATE_UP_BLOCK_K)
    rows = torch.empty(num_slots, hidden, dtype=torch.float32, device=x.device)  # weighted expert outputs
    flat_weights = weights.reshape(-1).to(torch.float32)
    _down_kernel[(blocks, cdiv(hidden, DOWN_BLOCK_N))](
        act, down_proj, rows, slots, block_expert, flat_weights, num_slots, num_experts, hidden, inter,
        act.stride(0), down_proj.stride(0), down_proj.stride(1), down_proj.stride(2), rows.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=DOWN_BLOCK_N, BLOCK_K=DOWN_BLOCK_K)
    return rows.view(num_tokens, top_k, hidden).sum(1).to(x.dtype)


if triton is not None:

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
            weight = tl.load(weights_ptr + safe, mask=valid, other=0.0)
            acc = acc * weight[:, None]
            tl.store(out_ptr + safe[:, None] * stride_ot + offs_n[None, :], acc, mask=valid[:, None] & n_ok[None, :])
