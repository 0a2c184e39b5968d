"""Lesson 8: a small decode batch's attention in one kernel per layer (Triton, CUDA only).

FlashInfer's captured decode runs three kernels per layer: the KV append, the split-KV decode
and the merge of its parts. At bs=1 each of them is a few microseconds of launch and ramp for
a fraction of a microsecond of memory traffic (a 300-token context of Qwen3-0.6B is 1.2 MB of
K/V per layer), and 28 layers pay it three times. :func:`append_decode_attention` does the
same work in **one** launch, with a program per (request, KV head, split):

* **append**: the program whose split holds a row's new position stores that row's new K/V
  (its KV head) in the pool, and uses it straight from registers for the score of the new
  token: no other program reads that slot in this step, so nothing races;
* **split-KV attention**: a row's context is cut into at most ``MAX_SPLITS`` pieces of at least
  ``SPLIT_MIN_TOKENS`` tokens, each walked by its own program (online softmax, all query heads
  of the GQA group at once), so a long context still spreads over the GPU. The number of
  pieces is computed on the device from the row's length: one captured launch serves every
  context length. The scores and the weighted values are two small tensor-core products
  (``tl.dot``) with the group's query heads padded to 16 rows;
* **RoPE on the way in** (with ``rotation``): the new q/k come as the QKV projection left them,
  and each program applies Qwen3's q/k norms and the rotation as it loads them (the kernel that
  did it before, :func:`~minisgl.layers.decode_kernels.qk_norm_rope` or FlashInfer's RoPE, is
  gone from the step); the pool receives the rotated k;
* **merge in place**: a row that needed one piece writes its output directly. Otherwise every
  piece writes its normalised output and log-sum-exp to a workspace and counts itself in on an
  arrival counter (an atomic add after a block-wide barrier, so its stores are visible first);
  the **last** piece to arrive merges them and resets the counter for the next replay.

:class:`~minisgl.attention.graph_attention.FusedDecodeGraphAttention` uses it for the graph
runner's small buckets when every row's context is short; larger batches and long contexts keep
FlashInfer's kernels (tensor cores, its scheduler), which stream long contexts faster
(``python -m benchmarks kernels``: 6.9 against 11.8 µs per layer at bs=1 and 128 tokens, 17.0
against 13.4 at 2048).
"""

from __future__ import annotations

__lesson__ = 8

from dataclasses import dataclass

import torch

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU machines
    triton = None

if triton is not None:
    from minisgl.layers.decode_kernels import hf_rms_scale, pdl, pdl_launch_early, pdl_launch_late, pdl_wait

# Most pieces one row's context is cut into, the fewest tokens a piece holds (a multiple of
# BLOCK_N), tokens per step of a piece's loop and warps per program. The tile is the one of
# `python -m benchmarks kernels --attention-sweep` on an H200 that came within 5% of the best of
# the sweep at contexts of 128 and 512 tokens for 1 and 4 rows (decode_kernels_h200.json).
MAX_SPLITS = 32
SPLIT_MIN_TOKENS = 64
BLOCK_N = 64
NUM_WARPS = 8


@dataclass(frozen=True)
class QKRotation:
    """RoPE (and Qwen3's per-head q/k RMSNorms before it) for :func:`append_decode_attention`
    to apply to the new q/k itself: ``positions [B]`` (int, on the device), ``cos_sin_cache
    [max_positions, D]`` float32 (cos in the first half, sin in the second:
    :meth:`~minisgl.layers.rotary.RotaryEmbedding.cos_sin_cache`), the norms' weights ``[D]``
    (None: no norms) and their epsilon."""

    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    q_norm_weight: torch.Tensor | None = None
    k_norm_weight: torch.Tensor | None = None
    eps: float = 0.0


if triton is not None:

    @triton.jit
    def _norm_rope_rows(ptrs, partner_ptrs, mask, w_ptr, offs_d, offs_p, cos, sin, eps, QK_NORM: tl.constexpr,
                        HEAD_DIM: tl.constexpr):
        """Rows of heads ``[R, D]`` (``ptrs``; ``partner_ptrs``: the same rows at each element's
        rotate-half partner, ``(d + D/2) % D``) normalised as Hugging Face does (float32, rounded
        before and after the weight) when ``QK_NORM``, then rotated: ``x * cos + partner * sin``
        with ``sin`` negated in the first half. Returns them rounded to the heads' dtype."""
        dtype = ptrs.dtype.element_ty
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        xp = tl.load(partner_ptrs, mask=mask, other=0.0).to(tl.float32)
        if QK_NORM:
            inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
            w = tl.load(w_ptr + offs_d).to(tl.float32)[None, :]
            wp = tl.load(w_ptr + offs_p).to(tl.float32)[None, :]
            x = hf_rms_scale(x, inv_rms, w, dtype)
            xp = hf_rms_scale(xp, inv_rms, wp, dtype)
        return (x * cos[None, :] + xp * sin[None, :]).to(dtype)

    @triton.jit
    def _kv_block(k_cache_ptr, v_cache_ptr, kv_indices_ptr, first_page, kv_head, tok, valid, new_pos, offs_d,
                  stride_slot, stride_kv_head, PAGE_SIZE: tl.constexpr):
        """The pool's K and V ``[BLOCK_N, D]`` of a block of a row's tokens ``tok`` (``valid``: the
        row's; the new token's slot, ``new_pos``, is not read: it is written in this step)."""
        cached = valid & (tok != new_pos)
        page = tl.load(kv_indices_ptr + first_page + tok // PAGE_SIZE, mask=valid, other=0)
        kv_off = (page.to(tl.int64) * PAGE_SIZE + tok % PAGE_SIZE)[:, None] * stride_slot \
            + kv_head * stride_kv_head + offs_d[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=cached[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=cached[:, None], other=0.0)
        return k, v

    @triton.jit
    def _attend_block(q, k, v, k_new, v_new, tok, valid, new_pos, sm_scale, m_i, l_i, acc):
        """One step of the online softmax over a block of K/V ``[BLOCK_N, D]`` (the new token's
        row taken from ``k_new``/``v_new``): returns the updated running max, sum and output."""
        is_new = (tok == new_pos)[:, None]
        k = tl.where(is_new, k_new[None, :], k)  # [BLOCK_N, D]
        v = tl.where(is_new, v_new[None, :], v)
        s = tl.dot(q, tl.trans(k)) * sm_scale  # [GROUP_PAD, BLOCK_N], float32
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _append_decode_kernel(
        q_ptr, k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_o_ptr, part_lse_ptr, arrivals_ptr,
        kv_indptr_ptr, kv_indices_ptr, last_page_len_ptr, sm_scale,
        positions_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, eps,
        stride_q_tok, stride_q_head, stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
        stride_slot, stride_kv_head, stride_o_tok, stride_o_head,
        NUM_KV_HEADS: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLIT_MIN: tl.constexpr,
        ROPE: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_launch_early(PDL)
        req = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        # Before the wait: what the kernel before this one (the QKV projection) does not write.
        # The page table is staged before the step's first kernel, and the pool's cached tokens
        # were written in earlier steps, so the first block's K/V are loaded while that kernel
        # finishes (with PDL); only the new q/k/v are its output.
        first_page = tl.load(kv_indptr_ptr + req)
        num_pages = tl.load(kv_indptr_ptr + req + 1) - first_page
        seq_len = (num_pages - 1) * PAGE_SIZE + tl.load(last_page_len_ptr + req)  # the new token included
        # Pieces of the context: at most MAX_SPLITS, each at least SPLIT_MIN tokens, whole blocks.
        num_splits = tl.minimum(tl.cdiv(seq_len, SPLIT_MIN), MAX_SPLITS)
        split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        num_splits = tl.cdiv(seq_len, split_len)  # the pieces that hold tokens
        start = split * split_len
        end = tl.minimum(start + split_len, seq_len)  # (before start for a piece with no tokens)
        new_pos = seq_len - 1
        offs_d = tl.arange(0, HEAD_DIM)
        first_tok = start + tl.arange(0, BLOCK_N)
        first_valid = first_tok < end
        k_first, v_first = _kv_block(k_cache_ptr, v_cache_ptr, kv_indices_ptr, first_page, kv_head, first_tok,
                                     first_valid, new_pos, offs_d, stride_slot, stride_kv_head, PAGE_SIZE)
        if ROPE:
            half: tl.constexpr = HEAD_DIM // 2
            offs_p = (offs_d + half) % HEAD_DIM  # each element's rotate-half partner
            rope_row = cos_sin_ptr + tl.load(positions_ptr + req).to(tl.int64) * HEAD_DIM
            cos = tl.load(rope_row + offs_d % half)
            sin = tl.load(rope_row + half + offs_d % half)
            sin = tl.where(offs_d < half, -sin, sin)
        pdl_wait(PDL)  # every program, even one whose split holds no tokens (see decode_kernels.pdl)
        if start < seq_len:
            offs_g = tl.arange(0, GROUP_PAD)  # the group's query heads, padded to 16 rows for tl.dot
            g_mask = offs_g < GROUP
            q_heads = kv_head * GROUP + offs_g
            q_rows = q_ptr + req * stride_q_tok + q_heads[:, None] * stride_q_head  # [GROUP_PAD, 1]
            k_row = k_new_ptr + req * stride_k_tok + kv_head * stride_k_head + tl.zeros((1, 1), tl.int32)  # [1, 1]
            if ROPE:  # the new q/k arrive as the QKV projection left them: norms and RoPE here
                q = _norm_rope_rows(q_rows + offs_d[None, :], q_rows + offs_p[None, :], g_mask[:, None], q_norm_ptr,
                                    offs_d, offs_p, cos, sin, eps, QK_NORM, HEAD_DIM)  # [GROUP_PAD, D]
                whole_row = offs_d[None, :] < HEAD_DIM  # [1, D], all true
                k_new = tl.reshape(_norm_rope_rows(k_row + offs_d[None, :], k_row + offs_p[None, :], whole_row, k_norm_ptr,
                                                   offs_d, offs_p, cos, sin, eps, QK_NORM, HEAD_DIM), (HEAD_DIM,))
            else:
                q = tl.load(q_rows + offs_d[None, :], mask=g_mask[:, None], other=0.0)  # [GROUP_PAD, D]
                k_new = tl.load(k_new_ptr + req * stride_k_tok + kv_head * stride_k_head + offs_d)  # [D]
            v_new = tl.load(v_new_ptr + req * stride_v_tok + kv_head * stride_v_head + offs_d)
            if split == num_splits - 1:  # this piece holds the new token: append it to the pool
                new_page = tl.load(kv_indices_ptr + first_page + new_pos // PAGE_SIZE).to(tl.int64)
                new_off = (new_page * PAGE_SIZE + new_pos % PAGE_SIZE) * stride_slot + kv_head * stride_kv_head
                tl.store(k_cache_ptr + new_off + offs_d, k_new)
                tl.store(v_cache_ptr + new_off + offs_d, v_new)
            m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores
            l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp(score - max)
            acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
            m_i, l_i, acc = _attend_block(q, k_first, v_first, k_new, v_new, first_tok, first_valid, new_pos,
                                          sm_scale, m_i, l_i, acc)
            for block in range(start + BLOCK_N, end, BLOCK_N):  # the piece's other blocks
                tok = block + tl.arange(0, BLOCK_N)
                valid = tok < end
                k, v = _kv_block(k_cache_ptr, v_cache_ptr, kv_indices_ptr, first_page, kv_head, tok, valid, new_pos,
                                 offs_d, stride_slot, stride_kv_head, PAGE_SIZE)
                m_i, l_i, acc = _attend_block(q, k, v, k_new, v_new, tok, valid, new_pos, sm_scale, m_i, l_i, acc)
            pdl_launch_late(PDL)
            out_ptrs = out_ptr + req * stride_o_tok + q_heads[:, None] * stride_o_head + offs_d[None, :]
            if num_splits == 1:
                tl.store(out_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
            else:
                # This piece's normalised output and log-sum-exp, at [row, q head, piece].
                part = (req * NUM_KV_HEADS * GROUP + q_heads) * MAX_SPLITS  # [GROUP_PAD]
                tl.store(part_o_ptr + (part + split)[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None],
                         mask=g_mask[:, None])
                tl.store(part_lse_ptr + part + split, m_i + tl.log(l_i), mask=g_mask)
                tl.debug_barrier()  # every thread's stores are made before the arrival below
                arrived = tl.atomic_add(arrivals_ptr + req * NUM_KV_HEADS + kv_head, 1, sem="acq_rel")
                if arrived == num_splits - 1:  # the last piece in: merge them all, in piece order
                    lse_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
                    total = tl.zeros([GROUP_PAD], tl.float32)
                    merged = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
                    for piece in range(0, num_splits):  # .cg: read from L2, where the other SMs wrote
                        lse = tl.load(part_lse_ptr + part + piece, mask=g_mask, other=0.0, cache_modifier=".cg")
                        o = tl.load(part_o_ptr + (part + piece)[:, None] * HEAD_DIM + offs_d[None, :],
                                    mask=g_mask[:, None], other=0.0, cache_modifier=".cg")
                        new_max = tl.maximum(lse_max, lse)
                        scale_old, scale_piece = tl.exp(lse_max - new_max), tl.exp(lse - new_max)
                        merged = merged * scale_old[:, None] + o * scale_piece[:, None]
                        total = total * scale_old + scale_piece
                        lse_max = new_max
                    tl.store(out_ptrs, (merged / total[:, None]).to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
                    tl.atomic_xchg(arrivals_ptr + req * NUM_KV_HEADS + kv_head, 0)  # ready for the next step


class AppendDecodeWorkspace:
    """The device buffers :func:`append_decode_attention` needs for up to ``max_bs`` rows of
    ``num_qo_heads`` query heads over ``num_kv_heads`` KV heads: the pieces' outputs
    ``part_o [max_bs * Hq * MAX_SPLITS, D]`` and log-sum-exps (float32), and the arrival
    counters ``[max_bs * Hkv]`` (int32, zero between launches). Allocated once, before any
    graph capture: the captured kernels read them at these addresses on every replay."""

    def __init__(self, max_bs: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, device: torch.device) -> None:
        rows = max_bs * num_qo_heads * MAX_SPLITS
        self.max_bs = max_bs
        self.part_o = torch.empty(rows, head_dim, dtype=torch.float32, device=device)
        self.part_lse = torch.empty(rows, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(max_bs * num_kv_heads, dtype=torch.int32, device=device)


def append_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, last_page_len: torch.Tensor,
    workspace: AppendDecodeWorkspace, out: torch.Tensor | None = None, rotation: QKRotation | None = None,
    split_min: int = SPLIT_MIN_TOKENS, block_n: int = BLOCK_N, num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Append each row's new K/V to the pool and attend, in one kernel.

    ``q [B, Hq, D]``, ``k``/``v [B, Hkv, D]``: one new token per row (views with a unit stride
    along ``D`` are fine, e.g. slices of the QKV projection's output). ``k_cache``/``v_cache``
    ``[num_pages, page_size, Hkv, D]``: one layer of the pool. ``kv_indptr [B+1]``,
    ``kv_indices``, ``last_page_len [B]`` (int32, on the device) describe each row's pages
    **with** the new token (FlashInfer's convention: row ``i`` has ``(pages - 1) * page_size +
    last_page_len[i]`` tokens, the new one last). Returns ``[B, Hq, D]`` in ``q``'s dtype.
    With ``rotation`` the new ``q``/``k`` are given before RoPE (and Qwen3's q/k norms): the
    kernel applies them as it loads them (the pool receives the rotated ``k``; ``q`` and ``k``
    themselves are left as they were), one launch instead of two.
    ``split_min`` (a multiple of ``block_n``), ``block_n`` and ``num_warps`` override the tuned
    tile (the micro-benchmark's sweep). A row is cut into at most ``MAX_SPLITS`` pieces."""
    if triton is None:
        raise RuntimeError("the fused decode kernel needs a CUDA build of torch with Triton")
    B, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    if B > workspace.max_bs:
        raise ValueError(f"{B} rows, but the workspace holds {workspace.max_bs}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"append_decode_attention needs {name} contiguous along head_dim, got {t.stride()}")
    k_flat, v_flat = k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D)  # one row per slot
    out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device) if out is None else out
    group = Hq // Hkv
    if split_min % block_n:
        raise ValueError(f"split_min ({split_min}) must be a multiple of block_n ({block_n})")
    rope = rotation is not None
    qk_norm = rope and rotation.q_norm_weight is not None
    if rope and rotation.cos_sin_cache.shape[-1] != D:
        raise ValueError(f"the cos/sin cache rows hold {rotation.cos_sin_cache.shape[-1]} values, head_dim is {D}")
    unused = q  # any tensor: the kernel reads the rotation's pointers only when it rotates
    mode = pdl(q)
    _append_decode_kernel[(B, Hkv, MAX_SPLITS)](
        q, k, v, k_flat, v_flat, out, workspace.part_o, workspace.part_lse, workspace.arrivals,
        kv_indptr, kv_indices, last_page_len, D**-0.5,
        rotation.positions if rope else unused, rotation.cos_sin_cache if rope else unused,
        rotation.q_norm_weight if qk_norm else unused, rotation.k_norm_weight if qk_norm else unused,
        rotation.eps if rope else 0.0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_flat.stride(0), k_flat.stride(1), out.stride(0), out.stride(1),
        NUM_KV_HEADS=Hkv, PAGE_SIZE=page_size, GROUP=group, GROUP_PAD=max(triton.next_power_of_2(group), 16),
        HEAD_DIM=D, BLOCK_N=block_n, MAX_SPLITS=MAX_SPLITS, SPLIT_MIN=split_min,
        ROPE=rope, QK_NORM=qk_norm, PDL=mode, launch_pdl=mode > 0, num_warps=num_warps,
    )
    return out
