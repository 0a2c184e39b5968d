"""Lesson 8: fewer, fatter kernels for a decode step (Triton, CUDA only).

With CUDA graphs the host is gone from a bs=1 decode step, and what is left is the device
running a few hundred small kernels back to back. Two kinds of them cost more than they must:

* **One-row matmuls.** At bs=1 every projection is a GEMV, ``y [1, N] = x [1, K] @ W[N, K]^T``:
  it reads the whole weight matrix to do two flops per weight, so its time is the time to
  stream ``W`` from memory. For Qwen3-0.6B's matrices (4-12 MB) cuBLAS's kernels reach a
  quarter to a half of the memory's bandwidth. :func:`gemv` gives each program ``BLOCK_N``
  whole rows of ``W`` (a small tile: thousands of programs keep many loads in flight), loads
  them in wide chunks, multiplies by ``x`` in float32 and sums along the row. It runs for
  one-row inputs inside a graph runner's work only (:class:`DecodeLinear`,
  :func:`graph_work`); anything bigger stays with cuBLAS, whose tensor-core kernels win as
  soon as several rows share each weight load. ``python -m benchmarks kernels`` measures
  both. The SwiGLU MLP's down projection takes ``[gate | up]`` and computes
  ``silu(gate) * up`` as it loads its input (:class:`DecodeMLP`): the activation's own kernel
  is gone. The same way the projections that follow a pre-norm step (QKV, gate/up) take the
  sub-layer's output and the residual stream, add them, normalise the sum as Hugging Face does
  and multiply (:func:`norm_gemv`, through lesson 1's
  :func:`~minisgl.models.model.normed_projection`): the residual add + RMSNorm kernels are gone
  too, all but the final norm's.
* **Qwen3's per-head norms and RoPE.** Each layer ran three kernels over the same 24 heads
  (RMSNorm of q, RMSNorm of k, RoPE of both). :func:`qk_norm_rope` does all three in one pass,
  in place on the QKV projection's output: a program per (token, head) (per 16 tokens of a head
  at prefill sizes) loads the head once, normalises it exactly as Hugging Face does (float32,
  rounded back before the weight), rotates it and stores it.

* **The gaps between kernels.** Each kernel of a replay starts only when the one before it has
  finished: a grid launch, a ramp-up and the previous kernel's last programs draining, a few
  microseconds per kernel. On Hopper and later GPUs every Triton decode kernel here (and lesson
  11's) launches with **programmatic dependent launch** (:func:`pdl`): it is launched while the
  previous one still runs, loads what does not depend on it (the weights), and waits for it only
  before reading its input. ``python -m benchmarks pdl`` compares it off, early and late.

:class:`DecodeLayers` hands them to the model through lesson 1's :class:`Layers` seam (the
same one lesson 9 fills with its parallel layers); the builder uses it for every engine. On the
CPU, without Triton, in float32, or with ``set_fused_kernels(False)`` everything runs the
plain torch / FlashInfer path of lesson 1, and each fused kernel has a GPU test against it.
"""

from __future__ import annotations

__lesson__ = 8

import contextlib
import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.config import ModelConfig
from minisgl.layers import fused
from minisgl.layers.rotary import RotaryEmbedding
from minisgl.models.model import MLP, Layers

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none.
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - exercised on CPU machines
    triton = None

# One program's tile of W: at most GEMV_TILE elements, BLOCK_K up to GEMV_MAX_BLOCK_K columns.
# Chosen by `python -m benchmarks kernels --sweep` (H100): within 6% of the best tile of the
# sweep for each of the ten Qwen3-0.6B and Llama-3.1-8B projections. One exception: a matrix of
# more than GEMV_MANY_ROWS rows that are one chunk each (an LM head of 2,048 columns) would be
# that many programs of a single 4 KB load, each paying its own scheduling; it takes chunks of
# GEMV_TILE // 2 columns, two rows a program (the Qwen3-30B-A3B shape's LM head [151,936 x 2,048]
# on an H200: 184 us with one row a program, 134-137 with two; 2678e4f and f3065e3 sweeps).
GEMV_TILE = 2048
GEMV_MAX_BLOCK_K = 2048
GEMV_MANY_ROWS = 65536
# With the SwiGLU activation fused in, every program computes the activation of its columns again,
# so a program takes more rows: about GEMV_SILU_AND_MUL_PROGRAMS programs in all, chunks of
# GEMV_SILU_AND_MUL_MAX_BLOCK_K columns. `python -m benchmarks kernels --sweep --sweep-parts swiglu`
# on an H200 (decode_kernels_swiglu_sweep_h200.json): Qwen3-0.6B's down projection [1024 x 3072]
# best at 2 rows x 1024 (4.1 us against 5.4 for the activation kernel + GEMV), Llama-3.1-8B's
# [4096 x 14336] at 8 rows x 1024 (28.3 us against 31.5): 512 programs both times. (With two rows,
# Llama's took 35.6: 2,048 programs each recomputing the activation of all 14,336 columns.)
GEMV_SILU_AND_MUL_MAX_BLOCK_K = 1024
GEMV_SILU_AND_MUL_PROGRAMS = 512
# With the pre-norm step (residual add + RMSNorm) fused in (norm_gemv), each program takes the
# whole row in one chunk, normalises it, and multiplies K // GEMV_NORMED_COLUMNS_PER_ROW rows by it
# (at most GEMV_NORMED_MAX_TILE weights: registers): the norm's work grows with the row, so a
# longer row amortises it over more rows (4 rows of 1,024, 8 of 2,048). That pays only for short
# rows: `python -m benchmarks kernels --sweep --sweep-parts norm` on an H200 (before the weights
# were loaded ahead of the norm, one row of 4,096 a program) found Llama-3.1-8B's QKV and gate/up
# (K = 4,096) slower fused than FlashInfer's norm + the GEMV, Qwen3-0.6B's (K = 1,024) faster; so
# the model fuses it for rows of at most GEMV_NORMED_MAX_K.
# The Qwen3-30B-A3B shape's QKV (K = 2,048; three sweeps at 2678e4f and f3065e3): 7.5 us with 8
# rows a program against 8.5 with 2, and 8.2-8.3 as FlashInfer's norm + the GEMV.
GEMV_NORMED_COLUMNS_PER_ROW = 256
GEMV_NORMED_MAX_TILE = 16384
GEMV_NORMED_MAX_K = 2048
# qk_norm_rope: one (token, head) per program for a decode batch; from this many tokens on
# (prefill) a program takes QK_NORM_ROPE_BLOCK_T tokens of one head (fewer, fuller programs).
QK_NORM_ROPE_MANY_TOKENS = 64
QK_NORM_ROPE_BLOCK_T = 16


_graph_work = False  # True while a graph runner warms up or captures (see graph_work)
# Programmatic dependent launch (see pdl): PDL_OFF, PDL_EARLY or PDL_LATE, where each kernel lets
# the next one launch. MINISGL_PDL=0 / early / late in the environment, or set_pdl().
PDL_OFF, PDL_EARLY, PDL_LATE = 0, 1, 2
_PDL_MODES = {"0": PDL_OFF, "off": PDL_OFF, "early": PDL_EARLY, "1": PDL_EARLY, "late": PDL_LATE}
_pdl_mode = _PDL_MODES.get(os.environ.get("MINISGL_PDL", "early").lower(), PDL_EARLY)


@contextlib.contextmanager
def graph_work():
    """Marks the work a graph runner captures (and the warm-up before it, which compiles the
    kernels): the one-row GEMV runs only there. Eagerly a bs=1 step is bound by the host, and a
    Triton launch costs the host more than cuBLAS's; inside a graph launches are free."""
    global _graph_work
    previous, _graph_work = _graph_work, True
    try:
        yield
    finally:
        _graph_work = previous


def in_graph_work() -> bool:
    """Whether a graph runner's work is being warmed up or captured now (:func:`graph_work`)."""
    return _graph_work


@functools.cache
def triton_available() -> bool:
    return triton is not None and torch.cuda.is_available()


def set_pdl(mode: int) -> None:
    """Programmatic dependent launch for this lesson's kernels and lesson 11's decode kernels:
    ``PDL_OFF``, ``PDL_EARLY`` (default: each kernel lets the next one launch as it starts) or
    ``PDL_LATE`` (once it has done its loads and sums); ``MINISGL_PDL=0`` / ``early`` / ``late``
    in the environment sets it from the start. A benchmark compares them in one run; a graph
    captured before the change keeps its launches."""
    global _pdl_mode
    if mode not in (PDL_OFF, PDL_EARLY, PDL_LATE):
        raise ValueError(f"PDL mode must be PDL_OFF, PDL_EARLY or PDL_LATE, not {mode!r}")
    _pdl_mode = mode


PDL_NAMES = {PDL_OFF: "0", PDL_EARLY: "early", PDL_LATE: "late"}  # as MINISGL_PDL spells them


def pdl_mode() -> int:
    """The programmatic dependent launch mode set now (:func:`set_pdl`, ``MINISGL_PDL``); a
    benchmark records it (``PDL_NAMES``) with its results."""
    return _pdl_mode


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl(x: torch.Tensor) -> int:
    """How a kernel on ``x``'s device launches: with **programmatic dependent launch** (PDL:
    Hopper and later; :func:`set_pdl`'s mode) or not (``PDL_OFF``, 0). The kernels take it as
    their ``PDL`` constant and launch with ``launch_pdl=mode > 0``.

    A kernel normally starts only when the one before it on the stream has finished: at bs=1,
    where each kernel is a few microseconds, the gap between them (the last programs draining, the
    next grid launching and ramping up) is a good part of the step. With PDL the next kernel is
    launched as soon as every program of this one has said so (:func:`pdl_launch_early`, first
    thing in each of our kernels, or :func:`pdl_launch_late`, once a program's loads and sums
    are done and only its stores are left); its programs load what does not depend on this kernel (the
    weights; the page table and the KV pool's cached tokens, staged or written before the step's
    first kernel; a kernel further back's output, when the kernel between lets the next one
    launch only after its own wait), then wait (:func:`pdl_wait`) until this kernel has finished
    and its writes are visible, and only then read its output. Every program of a PDL kernel waits, even one with
    nothing to do, and writes nothing before it: so a kernel finishes only after the one before it
    has, and no write can race a reader still running."""
    if _pdl_mode == PDL_OFF or not x.is_cuda:
        return PDL_OFF
    capable = _pdl_capable(x.device.index if x.device.index is not None else torch.cuda.current_device())
    return _pdl_mode if capable else PDL_OFF


def use_triton(x: torch.Tensor) -> bool:
    """Whether the Triton kernels may run on ``x``: CUDA, 16-bit, fused kernels allowed."""
    return fused.fused_kernels_enabled() and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) \
        and triton_available()


if triton is not None:

    @triton.jit
    def pdl_launch_early(PDL: tl.constexpr):
        """``PDL_EARLY``: let the next kernel on the stream launch now (a program's first step)."""
        if PDL == 1:
            gdc_launch_dependents()

    @triton.jit
    def pdl_launch_late(PDL: tl.constexpr):
        """``PDL_LATE``: let the next kernel launch now (once a program has only its stores left)."""
        if PDL == 2:
            gdc_launch_dependents()

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """With PDL (either mode): wait until the kernel before this one has finished, its writes visible."""
        if PDL != 0:
            gdc_wait()

    @triton.jit
    def _gemv_load(ptr, mask, EVEN: tl.constexpr):
        """The input's values at ``ptr`` in float32 (``mask`` unless ``EVEN``; masked ones 0),
        kept in the cache: every program reads them."""
        if EVEN:
            return tl.load(ptr, eviction_policy="evict_last").to(tl.float32)
        return tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)

    @triton.jit
    def _gemv_x(x_ptr, cols, K, EVEN: tl.constexpr, SILU_AND_MUL: tl.constexpr):
        """``x[cols]`` in float32; with ``SILU_AND_MUL``, ``x = [gate | up]`` (``2 * K`` wide) and
        this is ``silu(gate) * up``, rounded to ``x``'s dtype once (as FlashInfer's kernel does)."""
        if SILU_AND_MUL:
            gate = _gemv_load(x_ptr + cols, cols < K, EVEN)
            up = _gemv_load(x_ptr + K + cols, cols < K, EVEN)
            return (gate * tl.sigmoid(gate) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
        return _gemv_load(x_ptr + cols, cols < K, EVEN)

    @triton.jit
    def hf_rms_scale(x, inv_rms, w, dtype: tl.constexpr):
        """RMSNorm's scaling as Hugging Face rounds it: ``x * inv_rms`` in float32, rounded to
        ``dtype``, times the weight ``w``, rounded again; returned as float32."""
        return ((x * inv_rms).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)

    @triton.jit
    def add_rms_norm(x_ptr, res_ptr, norm_w_ptr, res_out_ptr, cols, K, eps, STORE: tl.constexpr,
                     EVEN: tl.constexpr, ADD: tl.constexpr):
        """A pre-norm step over one whole row (``cols``: all ``K`` of it): ``s = x (+ residual``
        with ``ADD``, the sum rounded to ``x``'s dtype as Hugging Face's 16-bit residual add rounds
        it), stored at ``res_out`` when ``ADD`` and ``STORE`` (the one program that writes the new
        residual stream); returns ``rmsnorm(s)`` rounded as Hugging Face rounds it (float32).
        Shared by :func:`norm_gemv` and lesson 11's router with the pre-norm step."""
        s = _gemv_load(x_ptr + cols, cols < K, EVEN)
        if ADD:
            s = (s + _gemv_load(res_ptr + cols, cols < K, EVEN)).to(x_ptr.dtype.element_ty).to(tl.float32)
            if STORE:
                tl.store(res_out_ptr + cols, s.to(res_out_ptr.dtype.element_ty), mask=cols < K)
        inv_rms = tl.rsqrt(tl.sum(s * s, axis=0) / K + eps)
        return hf_rms_scale(s, inv_rms, _gemv_load(norm_w_ptr + cols, cols < K, EVEN), x_ptr.dtype.element_ty)

    @triton.jit
    def _gemv_weights(w_ptr, rows, cols, N, K, stride_w, EVEN: tl.constexpr):
        """The tile ``W[rows, cols]`` (masked unless ``EVEN``; masked ones 0), streamed past the cache."""
        w_ptrs = w_ptr + rows[:, None] * stride_w + cols[None, :]
        if EVEN:  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks, widest loads
            return tl.load(w_ptrs, eviction_policy="evict_first")
        return tl.load(w_ptrs, mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0, eviction_policy="evict_first")

    @triton.jit
    def _gemv_input(x_ptr, res_ptr, norm_w_ptr, res_out_ptr, cols, K, eps, EVEN: tl.constexpr,
                    SILU_AND_MUL: tl.constexpr, NORM: tl.constexpr, ADD: tl.constexpr):
        """The input's chunk ``cols`` as the product takes it (float32): ``x``, the activation of
        ``x`` (``SILU_AND_MUL``) or ``rmsnorm(x (+ residual))`` (``NORM``: the caller made the
        whole row one chunk; with ``ADD`` the first program stores the new residual stream)."""
        if NORM:  # the first program writes the new residual stream
            return add_rms_norm(x_ptr, res_ptr, norm_w_ptr, res_out_ptr, cols, K, eps, tl.program_id(0) == 0, EVEN, ADD)
        return _gemv_x(x_ptr, cols, K, EVEN, SILU_AND_MUL)

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, N, K, stride_w, res_ptr, norm_w_ptr, res_out_ptr, eps,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SILU_AND_MUL: tl.constexpr, NORM: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr):
        pdl_launch_early(PDL)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        # The first chunk's weights first: they take longest, and they do not depend on the kernel
        # before this one, so with PDL they are in flight while it finishes.
        w = _gemv_weights(w_ptr, rows, cols, N, K, stride_w, EVEN)
        pdl_wait(PDL)  # the input is the previous kernel's output
        acc = w.to(tl.float32) * _gemv_input(x_ptr, res_ptr, norm_w_ptr, res_out_ptr, cols, K, eps, EVEN,
                                             SILU_AND_MUL, NORM, ADD)[None, :]
        for k0 in range(BLOCK_K, K, BLOCK_K):  # the other chunks (NORM: none)
            cols = k0 + tl.arange(0, BLOCK_K)
            w = _gemv_weights(w_ptr, rows, cols, N, K, stride_w, EVEN)  # again before the input's work
            acc += w.to(tl.float32) * _gemv_input(x_ptr, res_ptr, norm_w_ptr, res_out_ptr, cols, K, eps, EVEN,
                                                  SILU_AND_MUL, NORM, ADD)[None, :]
        pdl_launch_late(PDL)
        out = tl.sum(acc, axis=1)  # [BLOCK_N], float32
        if HAS_BIAS:
            out += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=rows < N)

    @triton.jit
    def _norm_rope_heads(ptr, stride_tok, tokens, mask, w_ptr, cos, sin, eps, HALF: tl.constexpr):
        """RMSNorm then RoPE (rotate-half pairs ``i``, ``i + HALF``) of one head of each token in
        ``tokens [BLOCK_T]`` (``mask``: the real ones), the head's first element at
        ``ptr + token * stride_tok``, in place. ``cos``/``sin``: ``[BLOCK_T, HALF]`` float32."""
        offs = tl.arange(0, HALF)
        ptrs = ptr + tokens[:, None] * stride_tok + offs[None, :]
        x1 = tl.load(ptrs, mask=mask[:, None], other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + HALF, mask=mask[:, None], other=0.0).to(tl.float32)
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        dtype = ptr.dtype.element_ty
        w1 = tl.load(w_ptr + offs).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)[None, :]
        y1 = hf_rms_scale(x1, inv_rms, w1, dtype)
        y2 = hf_rms_scale(x2, inv_rms, w2, dtype)
        tl.store(ptrs, (y1 * cos - y2 * sin).to(dtype), mask=mask[:, None])
        tl.store(ptrs + HALF, (y2 * cos + y1 * sin).to(dtype), mask=mask[:, None])

    # ``positions`` is often a view at an odd int64 offset of the staged batch; Triton would compile
    # a second variant for the unaligned pointer (and one per divisibility of the token count) in
    # the middle of serving, so neither is specialised on.
    @triton.jit(do_not_specialize=["num_tokens"], do_not_specialize_on_alignment=["positions_ptr"])
    def _qk_norm_rope_kernel(q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, positions_ptr, cos_sin_ptr, num_tokens,
                             stride_q_tok, stride_k_tok, eps, NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr,
                             BLOCK_T: tl.constexpr, PDL: tl.constexpr):
        pdl_launch_early(PDL)
        pdl_wait(PDL)  # q and k are the previous kernel's output
        tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        head = tl.program_id(1)  # q heads first, then k heads
        mask = tokens < num_tokens
        pos = tl.load(positions_ptr + tokens, mask=mask, other=0).to(tl.int64)
        offs = tl.arange(0, HALF)
        cos_ptrs = cos_sin_ptr + pos[:, None] * (2 * HALF) + offs[None, :]
        cos = tl.load(cos_ptrs, mask=mask[:, None], other=0.0)
        sin = tl.load(cos_ptrs + HALF, mask=mask[:, None], other=0.0)
        pdl_launch_late(PDL)
        if head < NUM_Q_HEADS:
            _norm_rope_heads(q_ptr + head * (2 * HALF), stride_q_tok, tokens, mask, q_weight_ptr, cos, sin, eps, HALF)
        else:
            _norm_rope_heads(k_ptr + (head - NUM_Q_HEADS) * (2 * HALF), stride_k_tok, tokens, mask, k_weight_ptr,
                             cos, sin, eps, HALF)


def gemv_blocks(n: int, k: int, silu_and_mul: bool = False, normed: bool = False) -> tuple[int, int]:
    """``(BLOCK_N, BLOCK_K)`` for a ``[1, k] @ [n, k]^T`` product: chunks of up to
    ``GEMV_MAX_BLOCK_K`` columns (of ``GEMV_TILE // 2`` when more than ``GEMV_MANY_ROWS`` rows
    would each be one chunk) and as many rows as fill a ``GEMV_TILE`` (small tiles, many
    programs: at bs=1 what counts is how many loads are in flight at once). When each program
    also computes its input (the activation with ``silu_and_mul``, the RMSNorm with ``normed``),
    more rows per program, so fewer programs repeat that work: for the activation, chunks of up
    to ``GEMV_SILU_AND_MUL_MAX_BLOCK_K`` columns and the rows (a power of two) that make about
    ``GEMV_SILU_AND_MUL_PROGRAMS`` programs; for the norm, the whole row in one chunk and
    ``K // GEMV_NORMED_COLUMNS_PER_ROW`` rows (at most ``GEMV_NORMED_MAX_TILE`` weights)."""
    if silu_and_mul:
        rows = 1 << max(0, (n // GEMV_SILU_AND_MUL_PROGRAMS).bit_length() - 1)  # a power of two <= n / programs
        return rows, min(triton.next_power_of_2(k), GEMV_SILU_AND_MUL_MAX_BLOCK_K)
    if normed:  # the whole row in one chunk (the norm needs all of it)
        block_k = triton.next_power_of_2(k)
        return max(1, min(block_k // GEMV_NORMED_COLUMNS_PER_ROW, GEMV_NORMED_MAX_TILE // block_k)), block_k
    block_k = min(triton.next_power_of_2(k), GEMV_MAX_BLOCK_K)
    if n > GEMV_MANY_ROWS and block_k >= k:  # an LM head of one-chunk rows: two rows a program
        block_k = min(block_k, GEMV_TILE // 2)
    return max(1, GEMV_TILE // block_k), block_k


def fits_int32_offsets(weight: torch.Tensor) -> bool:
    """Whether every element offset of ``weight`` fits the kernel's int32 arithmetic."""
    return weight.shape[0] * weight.stride(0) < 2**31


def _check_gemv(x: torch.Tensor, width: int, weight: torch.Tensor) -> None:
    n, k = weight.shape
    if x.shape != (1, width) or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"gemv needs x [1, {width}] and weight [{n}, {k}] contiguous along K, got {tuple(x.shape)}")
    if not fits_int32_offsets(weight):
        raise ValueError(f"gemv computes offsets in int32: weight [{n}, {k}] is too large")


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         blocks: tuple[int, int] | None = None, num_warps: int = 4, silu_and_mul: bool = False) -> torch.Tensor:
    """``F.linear`` of one row: ``x [1, K] @ weight[N, K]^T (+ bias [N]) -> [1, N]`` in
    ``x``'s dtype, accumulated in float32. ``x`` and ``weight`` must be contiguous along K.
    With ``silu_and_mul``, ``x`` is ``[1, 2K] = [gate | up]`` and the product is of
    ``silu(gate) * up`` (the SwiGLU MLP's down projection, its activation fused in).
    ``blocks`` and ``num_warps`` override the tile (the micro-benchmark's sweep)."""
    n, k = weight.shape
    _check_gemv(x, 2 * k if silu_and_mul else k, weight)
    block_n, block_k = blocks or gemv_blocks(n, k, silu_and_mul)
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    mode = pdl(x)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, out, n, k, weight.stride(0), x, x, x, 0.0,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN=(n % block_n == 0 and k % block_k == 0), HAS_BIAS=bias is not None,
        SILU_AND_MUL=silu_and_mul, NORM=False, ADD=False, PDL=mode, launch_pdl=mode > 0, num_warps=num_warps)
    return out


def norm_gemv(h: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              weight: torch.Tensor, bias: torch.Tensor | None = None, blocks: tuple[int, int] | None = None,
              num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm step and the projection after it, one row, in one kernel: ``residual <- h +
    residual`` (rounded to ``h``'s dtype; ``residual`` None: the stream starts at ``h``), then
    ``F.linear(rmsnorm(residual), weight, bias)``, RMSNorm rounded as Hugging Face rounds it.
    ``h``, ``residual [1, K]``, ``norm_weight [K]``, ``weight [N, K]`` (contiguous along K).
    Returns ``(y [1, N], residual [1, K])``; the inputs are not written. Every program computes
    the norm of the whole row for itself (it is only ``K`` numbers, one chunk: ``blocks`` may
    change the rows per program, not split the row) and the first one stores the new residual,
    so the norm's own kernel is gone from the step."""
    n, k = weight.shape
    _check_gemv(h, k, weight)
    if residual is not None:
        _check_gemv(residual, k, weight)
    if norm_weight.shape != (k,):
        raise ValueError(f"the norm's weight must be [{k}], got {tuple(norm_weight.shape)}")
    block_n, block_k = blocks or gemv_blocks(n, k, normed=True)
    if block_k < k:
        raise ValueError(f"norm_gemv takes the whole row in one chunk: BLOCK_K {block_k} < K {k}")
    out = torch.empty(1, n, dtype=h.dtype, device=h.device)
    new_residual = h if residual is None else torch.empty_like(h)
    mode = pdl(h)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        h, weight, bias if bias is not None else weight, out, n, k, weight.stride(0),
        residual if residual is not None else h, norm_weight, new_residual, eps,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN=(n % block_n == 0 and k % block_k == 0), HAS_BIAS=bias is not None,
        SILU_AND_MUL=False, NORM=True, ADD=residual is not None, PDL=mode, launch_pdl=mode > 0, num_warps=num_warps)
    return out, new_residual


def qk_norm_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, eps: float, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's ``q = rope(rmsnorm(q))``, ``k = rope(rmsnorm(k))`` in one kernel, **in place**.

    ``q [T, Hq, D]`` and ``k [T, Hkv, D]`` may be strided views of the QKV output (heads
    contiguous, ``D`` elements apart); ``q_weight``/``k_weight [D]`` are the norms' weights;
    ``cos_sin_cache [max_positions, D]`` float32 holds cos in its first half and sin in its
    second (:meth:`RotaryEmbedding.cos_sin_cache`)."""
    T, num_q_heads, D = q.shape
    for name, t in (("q", q), ("k", k)):
        if t.stride(2) != 1 or t.stride(1) != D:
            raise ValueError(f"qk_norm_rope needs {name} heads contiguous, got strides {t.stride()}")
    if T:
        block_t, warps = (1, 1) if T < QK_NORM_ROPE_MANY_TOKENS else (QK_NORM_ROPE_BLOCK_T, 4)
        mode = pdl(q)
        _qk_norm_rope_kernel[(triton.cdiv(T, block_t), num_q_heads + k.shape[1])](
            q, k, q_weight, k_weight, positions, cos_sin_cache, T, q.stride(0), k.stride(0), eps,
            NUM_Q_HEADS=num_q_heads, HALF=D // 2, BLOCK_T=block_t, PDL=mode, launch_pdl=mode > 0, num_warps=warps)
    return q, k


class DecodeLinear(nn.Linear):
    """An ``nn.Linear`` whose one-row products run :func:`gemv` (decode at bs=1 on CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return decode_linear(x, self.weight, self.bias)

    def forward_silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``self(silu(gate) * up)`` for ``gate_up = [gate | up]``: the SwiGLU MLP's down
        projection with its activation (one kernel for both in a one-row graph)."""
        return decode_linear(gate_up, self.weight, self.bias, silu_and_mul=True)

    def forward_normed(self, norm: nn.Module, h: torch.Tensor,
                       residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(self(norm(h + residual)), h + residual)``: the pre-norm step and this projection
        (lesson 1's :func:`~minisgl.models.model.normed_projection`), in one kernel
        (:func:`norm_gemv`) for one row in a graph's work."""
        if self.in_features <= GEMV_NORMED_MAX_K and one_row_gemv(h, self.weight) \
                and (residual is None or one_row_gemv(residual, self.weight)):
            return norm_gemv(h, residual, norm.weight, norm.eps, self.weight, self.bias)
        x, residual = norm.add_and_norm(h, residual)
        return self(x), residual


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [..., 2I] = [gate | up]`` -> ``[..., I]``
    (FlashInfer's one kernel where it runs, as lesson 1's MLP does)."""
    if fused.use_flashinfer(gate_up):
        return fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  silu_and_mul: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (of :func:`swiglu` of ``x`` with ``silu_and_mul``),
    through :func:`gemv` when ``x`` is one contiguous row inside a graph runner's work
    (:func:`graph_work`)."""
    if one_row_gemv(x, weight):
        return gemv(x, weight, bias, silu_and_mul=silu_and_mul)
    return F.linear(swiglu(x) if silu_and_mul else x, weight, bias)


def one_row_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` times ``weight`` runs the GEMV: one contiguous 16-bit row on CUDA, inside
    a graph runner's work (:func:`graph_work`), with offsets that fit the kernel's int32."""
    return _graph_work and x.dim() == 2 and x.shape[0] == 1 and x.stride(-1) == 1 and x.dtype == weight.dtype \
        and use_triton(x) and fits_int32_offsets(weight)


class DecodeMLP(MLP):
    """Lesson 1's SwiGLU MLP whose down projection takes ``[gate | up]`` and applies the
    activation itself (:meth:`DecodeLinear.forward_silu_and_mul`): at bs=1 in a graph, one
    kernel instead of two."""

    def activate_and_down(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward_silu_and_mul(gate_up)


class DecodeRotary(RotaryEmbedding):
    """Lesson 1's RoPE, with Qwen3's q/k norms and the rotation fused into one kernel on CUDA."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                q_norm: nn.Module | None = None, k_norm: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if q_norm is not None and use_triton(q) and q.stride(1) == q.shape[2] and k.stride(1) == k.shape[2]:
            return qk_norm_rope(positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps, self.cos_sin_cache())
        return super().forward(positions, q, k, q_norm, k_norm)


class DecodeLayers(Layers):
    """Lesson 1's layers with this lesson's decode kernels: :class:`DecodeLinear` projections
    and :class:`DecodeRotary`. Same parameters, same names, same results up to rounding."""

    def column(self, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
        return DecodeLinear(in_features, out_features, bias=bias)

    def row(self, in_features: int, out_features: int) -> nn.Module:
        return DecodeLinear(in_features, out_features, bias=False)

    def lm_head(self, hidden_size: int, vocab_size: int) -> nn.Module:
        return DecodeLinear(hidden_size, vocab_size, bias=False)

    def rotary(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int) -> RotaryEmbedding:
        return DecodeRotary(head_dim, theta, scaling, max_positions)

    def mlp(self, config: ModelConfig, layer_id: int) -> nn.Module:
        if config.is_moe_layer(layer_id):
            return super().mlp(config, layer_id)  # refused here; lesson 11's MoELayers builds it
        return DecodeMLP(config, self)
