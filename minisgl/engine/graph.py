"""Lesson 8: CUDA graphs. Capture the decode step once per batch size, replay it every token.

A decode step of a small model is hundreds of tiny kernels, and launching each one costs the
host more time than the device spends running it. A CUDA graph records a whole sequence of
kernel launches once (the *capture*); replaying it is one launch. The price is that a replay
does exactly what was recorded: the same kernels, with the same arguments, reading and writing
the same addresses. So:

* every input lives in a **static buffer** allocated before the capture and overwritten in
  place before each replay: input ids, positions, the attention metadata (page indices wide
  enough for the longest context), the output logits;
* shapes are fixed, so a graph is captured per **bucket** of batch sizes (1, 2, 4, 8, then
  every 8 up to ``max_bs``, and ``max_bs`` itself) and a batch runs in the smallest bucket that
  holds it, **padded**; padded rows read and write only the pool's **scratch page**, a page
  that no request ever owns. A small bucket may have two graphs (its attention's
  ``variants``: FlashInfer's kernels, or one fused kernel per layer that pays only for short
  contexts); preparing a batch says which one replays;
* anything else (a prefill, a mixed batch, a batch larger than ``max_bs``, a row longer than
  the static buffers) runs eagerly, as before.

Lesson 7's overlap keeps two batches in flight, and FlashInfer's ``plan`` stages its work
partition through a pinned host buffer copied asynchronously. So the runner keeps two *slots*,
each with its own attention buffers and its own graphs, used in turn; a slot is prepared again
only after the event recorded after its last replay has completed.

On the CPU there is nothing to capture: the same runner, buffers, buckets and padding run
eagerly, so the discipline (and every bug it guards against) is tested on a laptop.
"""

from __future__ import annotations

__lesson__ = 8

import gc
from dataclasses import dataclass, field
from typing import Any

import torch

from minisgl.attention.graph_attention import DecodeGraphAttention, decode_graph_attention
from minisgl.attention.paged import PagedBackend
from minisgl.core import Batch
from minisgl.engine.engine import EagerRunner
from minisgl.layers.decode_kernels import graph_work
from minisgl.models.model import CausalLM
from minisgl.utils import cdiv

NUM_GRAPH_SLOTS = 2  # batches in flight at once (lesson 7's overlap keeps two)


def bucket_sizes(max_bs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, 8, then every 8 up to ``max_bs``, and
    ``max_bs`` itself even when it is not on that ladder (e.g. 13 -> [1, 2, 4, 8, 13])."""
    if max_bs < 1:
        raise ValueError(f"max_bs must be at least 1, got {max_bs}")
    ladder = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    return sorted(set(ladder) | {max_bs})


@dataclass
class _GraphSlot:
    attention: DecodeGraphAttention
    graphs: dict[tuple[int, str], Any] = field(default_factory=dict)  # (bucket, variant) -> torch.cuda.CUDAGraph
    done: Any = None  # CUDA event recorded after the last replay from this slot


@dataclass
class GraphStats:
    """What ran where (for tests and the lesson): replays per bucket, eager decode steps."""

    replays: dict[int, int] = field(default_factory=dict)
    eager_decodes: int = 0


class GraphRunner:
    """The engine's runner (see :class:`~minisgl.engine.engine.ForwardRunner`) for lesson 8.

    Runs decode batches of up to ``max_bs`` rows, each row at most ``max_context`` tokens
    long, through captured graphs (CUDA) or the same static buffers eagerly (CPU).

    Static buffers: ``input_ids [max_bs]``, ``positions [max_bs]`` (int64), ``logits [max_bs,
    vocab]`` (the model's dtype), and per slot the attention's metadata buffers."""

    def __init__(self, model: CausalLM, backend: PagedBackend, max_bs: int, max_context: int) -> None:
        pool = backend.pool
        if pool.scratch_page is None:
            raise ValueError("CUDA graphs need a KV pool with a scratch page for padded rows")
        self.model = model
        self.backend = backend  # the eager backend over the same pool (prefills, large batches)
        self.device = pool.device
        self.capture_graphs = self.device.type == "cuda"
        self.max_bs = max_bs
        self.max_pages = cdiv(max_context, pool.page_size)
        self.scratch_page = pool.scratch_page
        self.buckets = bucket_sizes(max_bs)
        self.eager = EagerRunner(model, backend)  # everything the graphs cannot hold
        self.slots = [_GraphSlot(decode_graph_attention(backend, max_bs, self.max_pages, self.buckets))
                      for _ in range(NUM_GRAPH_SLOTS)]
        self._next_slot = 0
        dev = self.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        dtype = next(model.parameters()).dtype
        self.logits = torch.zeros(max_bs, model.config.vocab_size, dtype=dtype, device=dev)
        self.memory_pool = None
        self.stats = GraphStats()

    def forward(self, batch: Batch, input_ids: torch.Tensor, positions: torch.Tensor,
                logits_indices: torch.Tensor) -> torch.Tensor:
        """The engine's call: a decode batch that fits runs through the graphs (or, on the CPU,
        the same static buffers); anything else runs eagerly."""
        if self.can_run(batch):
            return self.run(batch, input_ids, positions)
        self.stats.eager_decodes += batch.mode == "decode"
        return self.eager.forward(batch, input_ids, positions, logits_indices)

    # --- which batches, which bucket -------------------------------------------------------

    def can_run(self, batch: Batch) -> bool:
        """A decode batch that fits: at most ``max_bs`` rows, none longer than the buffers."""
        if batch.mode != "decode" or batch.size > self.max_bs:
            return False
        return int(batch.meta.kv_indptr.diff().max()) <= self.max_pages

    def bucket_for(self, num_rows: int) -> int:
        """The smallest bucket that holds ``num_rows`` rows."""
        return next(b for b in self.buckets if b >= num_rows)

    # --- capture -----------------------------------------------------------------------------

    def capture(self) -> None:
        """Capture every bucket of every slot, largest first, all sharing one memory pool (a
        smaller graph reuses the memory of the larger ones). The first slot's buckets each first
        run twice eagerly (a warm-up: lazy initialisation, kernel compilation and selection) on a
        side stream; the second slot's run the same kernels on the same shapes, warmed up already,
        so they are captured straight away (a third of the build's forwards saved). CPU: no-op."""
        if not self.capture_graphs:
            return
        self.memory_pool = torch.cuda.graph_pool_handle()
        self._warmup_stream = torch.cuda.Stream()
        for i, slot in enumerate(self.slots):
            for b in sorted(self.buckets, reverse=True):
                for variant in slot.attention.variants(b):
                    slot.graphs[b, variant] = self._capture_one(slot, b, variant, warmups=2 if i == 0 else 0)
        torch.cuda.synchronize()

    def _capture_one(self, slot: _GraphSlot, b: int, variant: str = "", warmups: int = 2) -> Any:
        slot.attention.prepare(self._scratch_meta(b), variant)
        self.input_ids[:b].zero_()
        self.positions[:b].zero_()
        side = self._warmup_stream  # one for every capture: each new stream gets its own cuBLAS workspace
        side.wait_stream(torch.cuda.current_stream())
        with graph_work():  # the decode kernels meant for graphs (one-row GEMV), compiled in the warm-up
            with torch.cuda.stream(side):
                for _ in range(warmups):
                    self._forward(slot, b)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.memory_pool):
                self._forward(slot, b)
        return graph

    def _scratch_meta(self, b: int):
        """A decode batch of ``b`` rows that all live in the scratch page (for warm-up and capture)."""
        from minisgl.attention.metadata import BatchMetadata

        ps = self.slots[0].attention.pool.page_size
        return BatchMetadata.from_requests([[self.scratch_page]] * b, [0] * b, [1] * b, ps)

    def _forward(self, slot: _GraphSlot, b: int) -> None:
        """The captured work: the model on the static inputs, logits into the static output
        (in the model's dtype, as the LM head wrote them: at 256 rows of Qwen3-0.6B a float32
        copy would write and read 156 MB more)."""
        self.model(self.input_ids[:b], self.positions[:b], slot.attention, out=self.logits[:b])

    # --- run -----------------------------------------------------------------------------------

    def run(self, batch: Batch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[n, vocab]`` logits of a decode batch of ``n`` rows whose ``input_ids [n]`` and
        ``positions [n]`` are on the device. The result is a view of the static output: it
        stays valid until the next run (the sampler reads it right after, in stream order)."""
        n = batch.size
        b = self.bucket_for(n)
        assert b >= n, f"bucket {b} cannot hold {n} rows"
        slot = self.slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self.slots)
        if slot.done is not None:
            slot.done.synchronize()  # its last replay has finished with the attention buffers
            slot.done = None
        variant = slot.attention.prepare(batch.meta.padded(b, self.scratch_page))
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        if b > n:  # padded rows: token 0 at position 0, in the scratch page
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
        if slot.graphs:
            slot.graphs[b, variant].replay()
            slot.done = torch.cuda.Event()
            slot.done.record()
        else:
            self._forward(slot, b)
        self.stats.replays[b] = self.stats.replays.get(b, 0) + 1
        return self.logits[:n]


@dataclass
class RunnerMemory:
    """GPU memory (bytes) a graph runner takes: its static buffers and attention workspaces
    (``buffers``), and what capturing its graphs adds (``graphs``: the graphs' memory pool,
    i.e. the activations of the largest bucket, plus per-stream library workspaces)."""

    buffers: int
    graphs: int

    @property
    def total(self) -> int:
        return self.buffers + self.graphs


def measure_runner_memory(make_runner) -> RunnerMemory:
    """Build a runner with ``make_runner()`` (against a small temporary KV pool), capture, and
    measure the free-memory drop after each; then free everything. The real KV pool is sized
    from what is left once this is known (the graphs' memory known first, not guessed)."""

    def free_bytes() -> int:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info()[0]

    before = free_bytes()
    runner = make_runner()
    built = free_bytes()
    runner.capture()
    captured = free_bytes()
    del runner
    free_bytes()
    return RunnerMemory(buffers=max(0, before - built), graphs=max(0, built - captured))
