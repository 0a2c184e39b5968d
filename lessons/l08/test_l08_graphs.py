"""Lesson 8: the graph runner changes how a decode step is launched, never which tokens come out.

Run: pytest lessons/l08

On the CPU nothing is captured, but the runner is the same: static buffers, batches padded to
a bucket, padded rows in the scratch page, eager fallback for whatever does not fit. These
tests run decode batches of every size around the bucket boundaries, rows that outgrow the
static buffers, overlap and chunked prefill, and compare every request with HF alone. Then
they inject the three classic graph bugs and check that each is caught.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import TorchPagedBackend
from minisgl.core import Batch, Req
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.engine.graph import GraphRunner, bucket_sizes
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.scheduler.scheduler import Scheduler
from minisgl.testing import distinct_fraction, hf_greedy_tokens, tiny_checkpoint, tiny_model

NEW_TOKENS = 12


def test_bucket_ladder() -> None:
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(13) == [1, 2, 4, 8, 13]  # the maximum is always a bucket
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    ladder = bucket_sizes(256)
    assert ladder[:6] == [1, 2, 4, 8, 16, 24] and ladder[-1] == 256 and len(ladder) == 35
    with pytest.raises(ValueError):
        bucket_sizes(0)


def test_bucket_for_and_padding_by_hand() -> None:
    """The smallest bucket that holds the rows, and the docstring's padding example, exactly:
    real rows untouched, each extra row one token with a one-token history in the scratch page."""
    runner = SimpleNamespace(buckets=[1, 2, 4, 8, 13])
    assert [GraphRunner.bucket_for(runner, n) for n in range(1, 14)] == [1, 2, 4, 4, 8, 8, 8, 8, 13, 13, 13, 13, 13]
    i32 = torch.int32
    decode = BatchMetadata.from_requests([[7, 2], [5]], [6, 0], [1, 1], 4)
    assert decode.kv_indptr.tolist() == [0, 2, 3] and decode.kv_last_page_len.tolist() == [3, 1]
    out = decode.padded(4, scratch_page=0)
    assert [t.tolist() for t in (out.qo_indptr, out.kv_indptr, out.kv_indices, out.kv_last_page_len)] == [
        [0, 1, 2, 3, 4], [0, 2, 3, 4, 5], [7, 2, 5, 0, 0], [3, 1, 1, 1]]
    assert out.page_size == 4 and all(t.dtype == i32 for t in (out.qo_indptr, out.kv_indptr, out.kv_indices,
                                                              out.kv_last_page_len))
    assert out.seq_lens.tolist() == [7, 1, 1, 1]
    assert decode.padded(3, scratch_page=9).kv_indices.tolist() == [7, 2, 5, 9], "the scratch page, whichever it is"
    same = decode.padded(2, scratch_page=9)
    assert torch.equal(same.kv_indices, decode.kv_indices) and torch.equal(same.kv_indptr, decode.kv_indptr)
    with pytest.raises(ValueError):
        decode.padded(1, scratch_page=0)  # fewer rows than the batch has
    with pytest.raises(ValueError):  # a prefill row (two new tokens) is never padded
        BatchMetadata.from_requests([[7, 2], [5]], [5, 0], [2, 1], 4).padded(4, scratch_page=0)


def prompts_for(n: int, seed: int, length: tuple[int, int] = (3, 20)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, 512) for _ in range(rng.randint(*length))] for _ in range(n)]


def expected(arch: str, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    return list(hf_greedy_tokens(arch, tuple(prompt), n))


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_every_bucket_boundary_matches_hf(arch: str) -> None:
    """Decode batches of 1, 2, 3, 5, 8, 13 (the maximum, not on the ladder) and 14 (one more:
    eager) requests, through one LLM with ``cuda_graph_max_bs=13``; overlap and chunked prefill
    on (the defaults)."""
    llm = LLM(tiny_checkpoint(arch), cuda_graph_max_bs=13, max_running=16, max_seq_len=64)
    runner = llm.engine.runner
    assert runner is not None and runner.buckets == [1, 2, 4, 8, 13]
    for n in (1, 2, 3, 5, 8, 13, 14):
        before = dict(runner.stats.replays), runner.stats.eager_decodes
        prompts = prompts_for(n, seed=n)
        outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), progress=False)
        assert [o.token_ids for o in outs] == [expected(arch, p) for p in prompts], f"batch of {n}"
        used = {b: c - before[0].get(b, 0) for b, c in runner.stats.replays.items() if c > before[0].get(b, 0)}
        if n <= 13:
            assert runner.bucket_for(n) in used, f"a batch of {n} must replay bucket {runner.bucket_for(n)}: {used}"
        else:
            assert runner.stats.eager_decodes > before[1], "a batch larger than the maximum runs eagerly"
    assert distinct_fraction([t for o in outs for t in o.token_ids]) > 0.3


class CountingRunner(GraphRunner):
    """Records every batch size it ran and every bucket it chose."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: list[tuple[int, int]] = []

    def run(self, batch: Batch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.sizes.append((batch.size, self.bucket_for(batch.size)))
        return super().run(batch, input_ids, positions)


def make_scheduler(arch: str, *, max_bs: int, max_context: int, runner_cls: type[GraphRunner] = CountingRunner,
                   num_pages: int = 200, budget: int | None = 16, overlap: bool = True,
                   max_seq_len: int = 96) -> Scheduler:
    model = tiny_model(arch)
    pool = PagedKVPool.for_model(model.config, num_pages, 4, torch.float32, "cpu", scratch_page=True)
    backend = TorchPagedBackend(pool)
    runner = runner_cls(model, backend, max_bs, max_context)
    config = EngineConfig(max_running=16, max_prefill_tokens=512, max_seq_len=max_seq_len, chunked_prefill_size=budget,
                          overlap=overlap)
    return build_scheduler(make_engine(model, backend, config, runner), config, vocab_size=model.config.vocab_size)


def run(sched: Scheduler, jobs: list[tuple[int, list[int], int]], max_steps: int = 2000) -> list[Req]:
    """Drive ``sched``; job ``(arrival step, prompt, max_tokens)``."""
    reqs: list[Req] = []
    for step in range(max_steps):
        while len(reqs) < len(jobs) and jobs[len(reqs)][0] <= step:
            _, prompt, n = jobs[len(reqs)]
            reqs.append(sched.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True)))
        if len(reqs) == len(jobs) and not sched.has_work:
            kv = sched.kv
            assert kv.allocator.num_free + kv.tree.total_pages == kv.num_pages, "pages leaked"
            return reqs
        sched.step()
    raise AssertionError("the scheduler stopped making progress")


def joining_jobs(arch: str, n: int = 10, max_tokens: tuple[int, int] = (4, 40)) -> list[tuple[int, list[int], int]]:
    """Requests that join and leave at different steps: batch sizes change every few steps."""
    rng = random.Random(f"l08-{arch}")
    jobs = [(rng.randint(0, 15), [rng.randrange(8, 512) for _ in range(rng.randint(1, 24))], rng.randint(*max_tokens))
            for _ in range(n)]
    return sorted(jobs, key=lambda j: j[0])


@pytest.mark.parametrize("overlap", [True, False])
def test_rows_longer_than_the_static_buffers_run_eagerly(overlap: bool) -> None:
    """A runner whose buffers hold 40 tokens per row; requests grow to 64: their decode steps
    switch from the runner to eager mid-generation, and nothing changes in their tokens."""
    arch = "llama"
    sched = make_scheduler(arch, max_bs=10, max_context=40, overlap=overlap, budget=64)
    jobs = joining_jobs(arch)
    reqs = run(sched, jobs)
    runner = sched.engine.runner
    assert [r.output_ids for r in reqs] == [expected(arch, p, n) for _, p, n in jobs]
    assert runner.stats.eager_decodes > 0 and sum(runner.stats.replays.values()) > 0
    sizes = {n for n, _ in runner.sizes}
    assert len(sizes) >= 3, f"batch sizes should vary: {sizes}"
    assert any(b > n for n, b in runner.sizes), "some batches must have been padded"


def test_retraction_and_chunks_through_the_runner() -> None:
    """A tight pool (retraction) and a budget of 5 tokens (prompts in chunks, mixed batches)."""
    arch = "qwen2"
    sched = make_scheduler(arch, max_bs=5, max_context=96, num_pages=14, budget=5)
    jobs = joining_jobs(arch, 8, max_tokens=(4, 20))
    reqs = run(sched, jobs)
    assert sched.kv.stats.retractions >= 1
    assert [r.output_ids for r in reqs] == [expected(arch, p, n) for _, p, n in jobs]
    assert sum(sched.engine.runner.stats.replays.values()) > 0


# --- teeth: the three classic graph bugs -----------------------------------------------------

class PaddingIntoARealPage(CountingRunner):
    """Padded rows point at page 0, which belongs to a live request, instead of the scratch page."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scratch_page = 0


class BucketTooSmall(CountingRunner):
    """Chooses the bucket below the right one (a batch of 3 runs as 2)."""

    def bucket_for(self, num_rows: int) -> int:
        right = super().bucket_for(num_rows)
        smaller = [b for b in self.buckets if b < right]
        return smaller[-1] if smaller and right > num_rows else right


class StaleStaticPositions(CountingRunner):
    """Forgets to write the new positions into the static buffer before the replay."""

    def run(self, batch: Batch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return super().run(batch, input_ids, self.positions[: batch.size].clone())


@pytest.mark.parametrize("bug", [PaddingIntoARealPage, BucketTooSmall, StaleStaticPositions])
def test_graph_bugs_are_caught(bug: type[GraphRunner]) -> None:
    arch = "qwen3"
    jobs = joining_jobs(arch)
    good = run(make_scheduler(arch, max_bs=8, max_context=96), jobs)
    assert [r.output_ids for r in good] == [expected(arch, p, n) for _, p, n in jobs]
    sched = make_scheduler(arch, max_bs=8, max_context=96, runner_cls=bug)
    reqs = run(sched, jobs)
    wrong = [i for i, (r, (_, p, n)) in enumerate(zip(reqs, jobs)) if r.output_ids != expected(arch, p, n)]
    assert wrong, f"{bug.__name__} went unnoticed"
    print(f"{bug.__name__}: requests {wrong} differ from HF")


def test_graphs_are_off_by_default_on_the_cpu_and_settings_are_checked() -> None:
    path = tiny_checkpoint("qwen3")
    assert not isinstance(LLM(path, max_seq_len=32).engine.runner, GraphRunner)
    for bad in (-1, 1.5, "8", True):
        with pytest.raises(ValueError, match="cuda_graph_max_bs"):
            LLM(path, cuda_graph_max_bs=bad)
    llm = LLM(path, cuda_graph_max_bs=300, max_running=8, max_seq_len=32)
    assert llm.engine.runner.buckets[-1] == 8, "no bucket beyond the largest possible batch"
    assert llm.pool.scratch_page == llm.pool.num_pages, "the scratch page is beyond the allocator's pages"
    assert llm.scheduler.kv.allocator.num_free == llm.pool.num_pages


@pytest.mark.parametrize("where", ["prepare", "forward"])
def test_a_failure_inside_the_runner_fails_its_requests_alone(where: str, monkeypatch) -> None:
    """A step that fails in the runner (while it prepares a slot, or inside the captured work)
    fails the batch's requests with the error's message, returns their pages, and leaves the
    runner usable: the same requests afterwards give the same tokens."""
    from minisgl.llm import RequestFailedError

    llm = LLM(tiny_checkpoint("qwen3"), cuda_graph_max_bs=8, max_running=8, max_seq_len=64, prefix_cache=False)
    runner = llm.engine.runner
    prompts = prompts_for(5, seed=11)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    clean = [o.token_ids for o in llm.generate(prompts, params, progress=False)]
    target = runner.slots[1].attention if where == "prepare" else runner
    name = "prepare" if where == "prepare" else "_forward"
    original, calls = getattr(target, name), {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError(f"injected failure in {where}")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)
    with pytest.raises(RequestFailedError, match=f"injected failure in {where}"):
        llm.generate(prompts, params, progress=False)
    monkeypatch.undo()
    assert llm.scheduler.kv.allocator.num_free == llm.pool.num_pages and not llm.scheduler.running
    replays = sum(runner.stats.replays.values())
    assert [o.token_ids for o in llm.generate(prompts, params, progress=False)] == clean
    assert sum(runner.stats.replays.values()) > replays, "the runner keeps running decode steps"
