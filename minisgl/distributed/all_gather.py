"""Lesson 9 on GPUs: the logits' all-gather over symmetric memory, in one kernel.

Each decode step ends with one all-gather: every rank holds the logits of its slice of the
vocabulary, ``[T, vocab / tp]``, and every rank needs all of them, side by side. Through NCCL
that is its all-gather (about 20 µs inside a graph at bs=1 on two H200s, for a message of
128 KiB per rank) and then a copy that moves the rank dimension last (``torch.cat``).
:class:`SymmetricAllGather` does both in one kernel, the way lesson 9's
:mod:`~minisgl.distributed.all_reduce_norm` exchanges rows: each program takes a chunk of one
row of this rank's logits, copies it into this rank's symmetric buffer and into its own columns
of the output, signals the peers and waits for their signals (the same graph-safe flags and
two halves), then copies each peer's chunk from that peer's buffer into the peer's columns.
No arithmetic: the result is NCCL's, bit for bit.
"""

from __future__ import annotations

__lesson__ = 9

import torch
import torch.distributed as dist

from minisgl.distributed.all_reduce_norm import DTYPES, MAX_RANKS, SymmetricExchange, triton
from minisgl.utils import cdiv

if triton is not None:
    import triton.language as tl

BLOCK = 2048  # columns per program: the 0.6B shape's 75,968 logits per rank at TP=2 are 38 programs a row
MAX_SLOTS = 2048  # programs per call (rows x chunks): each has its flags and its counter
HALF_BYTES = 4 << 20  # one half of the data: [T, vocab / tp] up to this size takes the kernel
FLAG_BYTES = MAX_SLOTS * MAX_RANKS * 8  # int64 flags [MAX_SLOTS, MAX_RANKS], before the data


class SymmetricAllGather(SymmetricExchange):
    """``[T, n]`` on every rank -> ``[T, size * n]``, rank r's block in columns ``r * n .. (r +
    1) * n``, over a symmetric buffer every rank creates together (the constructor is a
    collective). Check :func:`~minisgl.distributed.all_reduce_norm.all_reduce_add_norm_available`
    first: the same needs (symmetric memory, Triton).

    Invariant: every rank makes the same calls, in the same order, with the same shapes (as for
    every collective), one at a time on one stream.
    """

    def __init__(self, device: torch.device | str, group: dist.ProcessGroup | None = None) -> None:
        super().__init__(device, group, slots=MAX_SLOTS, flag_bytes=FLAG_BYTES, half_bytes=HALF_BYTES)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether ``x [T, n]`` takes this path: inside a graph runner's work only, as lesson 9's
        fused all-reduce + norm (eagerly a Triton launch costs the host more than NCCL's call);
        rows of 16-byte multiples; at most ``MAX_SLOTS`` programs and ``HALF_BYTES`` of data."""
        from minisgl.layers.decode_kernels import in_graph_work

        return (in_graph_work() and x.is_cuda and x.dim() == 2 and x.dtype in DTYPES and x.is_contiguous()
                and (x.shape[1] * x.element_size()) % 16 == 0 and x.shape[0] * cdiv(x.shape[1], BLOCK) <= MAX_SLOTS
                and x.numel() * x.element_size() <= HALF_BYTES)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, n]`` (``fits``) -> ``[T, size * n]``, the same bits on every rank."""
        from minisgl.layers.decode_kernels import pdl

        rows, n = x.shape
        out = torch.empty(rows, self.size * n, dtype=x.dtype, device=x.device)
        chunks = cdiv(n, BLOCK)
        mode = pdl(x)
        _all_gather_last_dim_kernel[(rows, chunks)](
            x, out, self.buffers, self.epochs, n, HALF_BYTES // x.element_size(), RANK=self.rank, WORLD=self.size,
            FLAGS=FLAG_BYTES, FLAGS_PER_SLOT=MAX_RANKS, BLOCK=BLOCK, PDL=mode, launch_pdl=mode > 0, num_warps=4)
        return out


if triton is not None:
    from minisgl.distributed.all_reduce_norm import buffer_data, signal_and_wait
    from minisgl.layers.decode_kernels import pdl_launch_early, pdl_wait

    @triton.jit
    def _all_gather_last_dim_kernel(x_ptr, out_ptr, buffers_ptr, epochs_ptr, n, half_elems, RANK: tl.constexpr,
                                    WORLD: tl.constexpr, FLAGS: tl.constexpr, FLAGS_PER_SLOT: tl.constexpr,
                                    BLOCK: tl.constexpr, PDL: tl.constexpr):
        """Chunk ``program_id(1)`` of row ``program_id(0)``: this rank's into its buffer and its
        output columns, flags to the peers and from them, then each peer's chunk into that peer's
        columns. Its slot (flags and counter) is ``row * chunks + chunk``: every rank launches
        the same grid, so the counters agree. With ``PDL`` nothing is read before the wait: the
        input is the LM head's output and the counters may still be written by the call before."""
        pdl_launch_early(PDL)
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        slot = row * tl.num_programs(1) + chunk
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        ok = cols < n
        pdl_wait(PDL)
        dtype = x_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * n + cols, mask=ok)
        epoch = tl.load(epochs_ptr + slot)
        at = (epoch % 2) * half_elems + row * n  # the row's place in this call's half
        # (rows start 16-byte aligned, fits: the hints let loads and stores go 16 B at a time)
        tl.store(tl.multiple_of(buffer_data(buffers_ptr, RANK, FLAGS, dtype) + at, 16) + cols, x, mask=ok)
        out_row = tl.multiple_of(out_ptr + row * (WORLD * n), 16)
        tl.store(tl.multiple_of(out_row + RANK * n, 16) + cols, x, mask=ok)
        signal_and_wait(buffers_ptr, slot, epoch, RANK, WORLD, FLAGS_PER_SLOT)
        for peer in tl.static_range(WORLD):
            if peer != RANK:
                theirs = buffer_data(buffers_ptr, peer, FLAGS, dtype)
                # volatile: past the SM's own cache, which may hold this half from two calls ago
                chunk_of_peer = tl.load(tl.multiple_of(theirs + at, 16) + cols, mask=ok, volatile=True)
                tl.store(tl.multiple_of(out_row + peer * n, 16) + cols, chunk_of_peer, mask=ok)
        tl.store(epochs_ptr + slot, epoch + 1)
