"""Lesson 3, "write your own": a paged decode-attention kernel in Triton (CUDA only).

One program per (request, KV head). It walks the request's page list ``BLOCK_N`` tokens at a
time, turns each token's position into its slot (``page * page_size + offset``) and loads K/V
straight from the pool: no gathered copy. Softmax is computed online (running max and sum), so
the scores of a long context never have to be stored. All query heads of one GQA group are
served by the same program, so each K/V byte is read from memory once per group.

What it leaves out, on purpose: splitting one long request over several programs ("split-KV",
which FlashInfer does). With few requests, ``batch x H_kv`` programs cannot fill an H200's 132
SMs, and the micro-benchmark shows exactly that.
"""

from __future__ import annotations

__lesson__ = 3

import torch

from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import ReferencePagedBackend

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU machines
    triton = None


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr, sm_scale,
        stride_q_tok, stride_q_head, stride_kv_slot, stride_kv_head, stride_o_tok, stride_o_head,
        PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        req = tl.program_id(0)
        kv_head = tl.program_id(1)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        g_mask = offs_g < GROUP
        q_heads = kv_head * GROUP + offs_g
        q = tl.load(q_ptr + req * stride_q_tok + q_heads[:, None] * stride_q_head + offs_d[None, :],
                    mask=g_mask[:, None], other=0.0).to(tl.float32)  # [GROUP_PAD, D]

        first_page = tl.load(kv_indptr_ptr + req)
        seq_len = tl.load(seq_lens_ptr + req)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of scores
        l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp(score - max)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for start in range(0, seq_len, BLOCK_N):
            tok = start + tl.arange(0, BLOCK_N)
            valid = tok < seq_len
            page = tl.load(kv_indices_ptr + first_page + tok // PAGE_SIZE, mask=valid, other=0)
            slot = page.to(tl.int64) * PAGE_SIZE + tok % PAGE_SIZE  # walk the block table
            kv_off = slot[:, None] * stride_kv_slot + kv_head * stride_kv_head + offs_d[None, :]
            k = tl.load(k_ptr + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)  # [BLOCK_N, D]
            v = tl.load(v_ptr + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale  # [GROUP_PAD, BLOCK_N]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + req * stride_o_tok + q_heads[:, None] * stride_o_head + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


def paged_decode_attention(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor, block_n: int = 32,
) -> torch.Tensor:
    """Decode attention of ``q [B, Hq, D]`` over paged K/V ``[num_pages, page_size, Hkv, D]``.

    ``kv_indptr [B+1]`` / ``kv_indices`` (int32, on the GPU) list each request's pages;
    ``seq_lens [B]`` (int32) its number of cached tokens (the new token's K/V already appended).
    Returns ``[B, Hq, D]`` in ``q``'s dtype.
    """
    if triton is None:
        raise RuntimeError("the Triton decode kernel needs a CUDA build of torch with Triton")
    B, Hq, D = q.shape
    _, page_size, Hkv, _ = k_pages.shape
    group = Hq // Hkv
    k_flat = k_pages.view(-1, Hkv, D)  # token-flat view of the same memory
    v_flat = v_pages.view(-1, Hkv, D)
    out = torch.empty_like(q)
    _paged_decode_kernel[(B, Hkv)](
        q, k_flat, v_flat, out, kv_indptr, kv_indices, seq_lens, D**-0.5,
        q.stride(0), q.stride(1), k_flat.stride(0), k_flat.stride(1), out.stride(0), out.stride(1),
        PAGE_SIZE=page_size, GROUP=group, GROUP_PAD=max(triton.next_power_of_2(group), 1),
        HEAD_DIM=D, BLOCK_N=block_n, num_warps=4,
    )
    return out


class TritonDecodeBackend(ReferencePagedBackend):
    """Decode batches run the Triton kernel; prefill batches (and the K/V append) use the
    reference code. The lesson's kernel is the decode one, where memory bandwidth is everything."""

    def _plan(self, meta: BatchMetadata) -> None:
        super()._plan(meta)
        dev = self.pool.device
        self._kv_indptr = meta.kv_indptr.to(dev)
        self._kv_indices = meta.kv_indices.to(dev)
        self._seq_lens_dev = meta.seq_lens.to(torch.int32).to(dev)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        assert self.meta is not None, "plan() must run before forward()"
        if not self.meta.is_decode:
            return super().forward(q, k, v, layer_id)
        self.pool.store(layer_id, self._write_slots, k, v)
        return paged_decode_attention(
            q, self.pool.k[layer_id], self.pool.v[layer_id], self._kv_indptr, self._kv_indices, self._seq_lens_dev
        )
