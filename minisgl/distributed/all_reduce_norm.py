"""Lesson 9 on GPUs: the all-reduce, the residual add and the RMSNorm after it, in one kernel.

Every row-parallel projection (o_proj, down_proj) ends in an all-reduce, and in a pre-norm
transformer the next thing that happens to the sum is always the same: it is added to the
residual stream and normalised (:meth:`~minisgl.layers.norm.RMSNorm.add_and_norm`). At bs=1 on
two GPUs that is two latency-bound kernels per sub-layer (the one-shot all-reduce of
:mod:`minisgl.distributed.symmetric`, then FlashInfer's fused add + RMSNorm), 64 pairs a step
for Llama-3.1-8B. :class:`AllReduceAddNorm` does both in one kernel, one program per row:

1. the program copies this rank's partial sum of its row into this rank's symmetric buffer;
2. it tells every other rank so (a flag in *their* buffer) and waits for their flags;
3. it reads every rank's row, in rank order, and sums them in float32 (every rank gets the
   same bits), then adds the residual and normalises the row as lesson 8's ``add_rms_norm``
   does (Hugging Face's roundings), writing the new residual in place and the normed row.

The first layer's pre-norm step takes the embedding's sum with no residual stream yet (the
vocab-parallel embedding is a partial sum too: each rank embeds only the ids it owns): then
the sum itself starts the residual stream, written to a new tensor.

**Flags that work inside a CUDA graph.** A graph replays the same kernel arguments every time,
so the "which call is this" number cannot come from the host. Each rank keeps a counter per
row on its own GPU (``epochs``, advanced by the kernel): at its ``E``-th call a row's program
writes ``E + 1`` into its flag in each peer's buffer and waits until its own flags from the
peers read at least ``E + 1``. Every rank makes the same calls with the same rows (the same
program on the same batch), so the counters agree.

**Two halves.** The row's data alternates between two halves of the buffer (``E % 2``). A rank
that races ahead to its next call writes the other half, and it cannot get two calls ahead: its
next wait needs the peers' next flags, which they write only after finishing this call.
"""

from __future__ import annotations

__lesson__ = 9

import torch
import torch.distributed as dist

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU machines
    triton = None

MAX_ROWS = 512  # rows (tokens) per call: a decode batch, or a small prefill chunk
MAX_RANKS = 8
HALF_BYTES = 4 << 20  # one half of the data: [MAX_ROWS, 4096] in bf16
MAX_HIDDEN = 16384  # one program holds a whole row
FLAG_BYTES = MAX_ROWS * MAX_RANKS * 8  # int64 flags [MAX_ROWS, MAX_RANKS], before the data
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def all_reduce_add_norm_available(device: torch.device | str, size: int) -> bool:
    """Whether :class:`AllReduceAddNorm` can run here: symmetric memory between the ``size``
    GPUs (:func:`~minisgl.distributed.symmetric.symmetric_all_reduce_available`) and Triton."""
    from minisgl.distributed.symmetric import symmetric_all_reduce_available

    return triton is not None and 2 <= size <= MAX_RANKS and symmetric_all_reduce_available(device, size)


class SymmetricExchange:
    """What lesson 9's Triton collectives keep (this module's and :mod:`~minisgl.distributed.all_gather`'s):
    this rank's place, a symmetric buffer every rank creates together (the constructor is a
    collective) holding ``flag_bytes`` of int64 flags ``[slots, MAX_RANKS]`` and then two halves
    of ``half_bytes`` of data, every rank's buffer address (``buffers``), and a call counter per
    program slot on this GPU (``epochs [slots]``)."""

    def __init__(self, device: torch.device | str, group: dist.ProcessGroup | None, slots: int,
                 flag_bytes: int, half_bytes: int) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.buffer = symm_mem.empty(flag_bytes + 2 * half_bytes, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(self.buffer, group.group_name)
        # Every rank's buffer address in this process's address space (the peers' mapped over NVLink).
        self.buffers = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
        self.epochs = torch.zeros(slots, dtype=torch.int64, device=device)
        self.buffer[:flag_bytes].zero_()
        torch.cuda.synchronize(device)
        dist.barrier(group)  # no peer signals into a buffer before its flags are zero


class AllReduceAddNorm(SymmetricExchange):
    """``(rmsnorm(sum over ranks of partial + residual), that sum + residual)`` in one kernel,
    over a symmetric buffer every rank creates together (the constructor is a collective).

    Invariant: every rank makes the same calls, in the same order, with the same number of rows
    (as for every collective), one at a time on one stream.
    """

    def __init__(self, device: torch.device | str, group: dist.ProcessGroup | None = None) -> None:
        super().__init__(device, group, slots=MAX_ROWS, flag_bytes=FLAG_BYTES, half_bytes=HALF_BYTES)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (a ``[T, hidden]`` partial sum) takes this path: inside a graph runner's
        work only (lesson 8's ``graph_work``, as its one-row kernels). Eagerly a Triton launch
        costs the host more than the two kernels it replaces: with it everywhere, bs=1 decode of
        the Llama-3.1-8B shape at TP=2 without graphs took 22.5 ms a token, slower than TP=1's
        8.9 ms in the same run (two H200s, 34d90bc)."""
        from minisgl.layers.decode_kernels import in_graph_work

        return (in_graph_work() and x.is_cuda and x.dim() == 2 and x.dtype in DTYPES and x.is_contiguous()
                and x.shape[0] <= MAX_ROWS and x.shape[1] <= MAX_HIDDEN and x.shape[1] % 8 == 0
                and x.numel() * x.element_size() <= HALF_BYTES)

    def fits_norm(self, partial: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> bool:
        """Whether :meth:`__call__` takes these: ``fits(partial)``, a residual stream (or none:
        the first layer's) and a norm weight of the same row length and dtype."""
        return (self.fits(partial) and weight.shape == (partial.shape[1],) and weight.is_contiguous()
                and (residual is None or (residual.shape == partial.shape and residual.dtype == partial.dtype
                                          and residual.is_contiguous())))

    def __call__(self, partial: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``partial [T, hidden]``: this rank's partial sums. Returns ``(normed [T, hidden],
        residual)``, ``residual`` updated in place to ``sum + residual`` (as FlashInfer's fused
        add + RMSNorm does); with ``residual`` None, a new tensor holding the sum (the stream
        starts there, as :meth:`~minisgl.layers.norm.RMSNorm.add_and_norm` starts it). ``fits_norm``
        must hold."""
        from minisgl.layers.decode_kernels import pdl

        rows, hidden = partial.shape
        out = torch.empty_like(partial)
        add = residual is not None
        residual = residual if add else torch.empty_like(partial)
        block = triton.next_power_of_2(hidden)
        mode = pdl(partial)
        _all_reduce_add_norm_kernel[(rows,)](
            partial, residual, weight, out, self.buffers, self.epochs, hidden, HALF_BYTES // partial.element_size(),
            eps, RANK=self.rank, WORLD=self.size, FLAGS=FLAG_BYTES, FLAGS_PER_ROW=MAX_RANKS, BLOCK=block, ADD=add,
            PDL=mode, launch_pdl=mode > 0, num_warps=min(16, max(4, block // 512)))
        return out, residual


if triton is not None:
    from minisgl.layers.decode_kernels import hf_rms_scale, pdl_launch_early, pdl_wait

    @triton.jit
    def signal_and_wait(buffers_ptr, slot, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, FLAGS_PER_SLOT: tl.constexpr):
        """This program's data of call ``epoch`` is in this rank's buffer: write ``epoch + 1``
        into this rank's flag of ``slot`` in every peer's buffer, then wait until every peer's
        flag of ``slot`` in this rank's buffer reads at least ``epoch + 1`` (a peer may be a call
        ahead already). The flags are int64 ``[slots, FLAGS_PER_SLOT]`` at the start of each
        rank's buffer. Shared by this module's kernel and lesson 9's logits all-gather."""
        tl.debug_barrier()  # every thread's part of the data is stored before the flags below
        for peer in tl.static_range(WORLD):
            if peer != RANK:
                flags = tl.load(buffers_ptr + peer).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(flags + slot * FLAGS_PER_SLOT + RANK, epoch + 1, sem="release", scope="sys")
        my_flags = tl.load(buffers_ptr + RANK).to(tl.pointer_type(tl.int64)) + slot * FLAGS_PER_SLOT
        for peer in tl.static_range(WORLD):
            if peer != RANK:
                while tl.atomic_add(my_flags + peer, 0, sem="acquire", scope="sys") < epoch + 1:
                    pass
        tl.debug_barrier()  # no thread reads the peers' data before their flags are seen

    @triton.jit
    def buffer_data(buffers_ptr, rank, FLAGS: tl.constexpr, dtype: tl.constexpr):
        """Where the data of ``rank``'s buffer starts (after its flags), as a ``dtype`` pointer."""
        return (tl.load(buffers_ptr + rank).to(tl.pointer_type(tl.int8)) + FLAGS).to(tl.pointer_type(dtype))

    @triton.jit
    def _all_reduce_add_norm_kernel(partial_ptr, res_ptr, norm_w_ptr, out_ptr, buffers_ptr, epochs_ptr, hidden,
                                    half_elems, eps, RANK: tl.constexpr, WORLD: tl.constexpr, FLAGS: tl.constexpr,
                                    FLAGS_PER_ROW: tl.constexpr, BLOCK: tl.constexpr, ADD: tl.constexpr,
                                    PDL: tl.constexpr):
        """One row: this rank's partial sum into its buffer, flags to the peers and from them,
        the sum over the ranks in rank order (float32, rounded to the row's dtype, as an
        all-reduce's result is), ``s = sum + residual`` rounded (``ADD``; else ``s = sum``),
        stored as the new residual, ``rmsnorm(s)`` stored at ``out``. With ``PDL`` only the
        norm's weights are loaded before waiting for the previous kernel: everything else (the
        residual and the counters too) may still be written by the call before this one."""
        pdl_launch_early(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < hidden
        w = tl.load(norm_w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        pdl_wait(PDL)
        dtype = partial_ptr.dtype.element_ty
        x = tl.load(partial_ptr + row * hidden + cols, mask=ok, other=0.0)
        epoch = tl.load(epochs_ptr + row)  # this row's calls so far, the same on every rank
        at = (epoch % 2) * half_elems + row * hidden  # the row's place in this call's half
        # (the row's start is 16-byte aligned: hidden % 8 == 0, fits_norm; the hint lets loads and stores go 16 B at a time)
        tl.store(tl.multiple_of(buffer_data(buffers_ptr, RANK, FLAGS, dtype) + at, 16) + cols, x, mask=ok)
        signal_and_wait(buffers_ptr, row, epoch, RANK, WORLD, FLAGS_PER_ROW)
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            if peer == RANK:
                total += x.to(tl.float32)
            else:
                theirs = buffer_data(buffers_ptr, peer, FLAGS, dtype)
                # volatile: past the SM's own cache, which may hold this half from two calls ago
                total += tl.load(tl.multiple_of(theirs + at, 16) + cols, mask=ok, other=0.0, volatile=True).to(tl.float32)
        s = total.to(dtype).to(tl.float32)
        if ADD:  # the residual add rounded as Hugging Face's 16-bit add is
            s = (s + tl.load(res_ptr + row * hidden + cols, mask=ok, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        tl.store(res_ptr + row * hidden + cols, s.to(dtype), mask=ok)
        inv_rms = tl.rsqrt(tl.sum(s * s, axis=0) / hidden + eps)
        tl.store(out_ptr + row * hidden + cols, hf_rms_scale(s, inv_rms, w, dtype).to(dtype), mask=ok)
        tl.store(epochs_ptr + row, epoch + 1)
