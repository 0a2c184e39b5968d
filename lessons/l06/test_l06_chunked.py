"""Lesson 6: chunked prefill gives every request exactly HF's tokens, and nobody waits behind a long prompt.

Run: pytest lessons/l06

With ``chunked_prefill_size`` a step carries at most that many tokens: one for each decoding
request, then new prompts (whole, while they fit), then the next chunk of the prompt being
chunked. Only a request's final chunk samples a token. These tests run budgets from 1 token to
64 with requests joining while others decode and others are mid-prefill, with the radix cache
on and off, and check seeded sampling, fairness (in steps) and three classic chunking bugs.
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl import SamplingParams
from minisgl.attention.paged import TorchPagedBackend
from minisgl.core import Batch, Req
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.scheduler.chunked import ChunkedPrefill
from minisgl.scheduler.scheduler import Scheduler
from minisgl.testing import distinct_fraction, hf_greedy_tokens, tiny_model

NEW_TOKENS = 20


class RecordingScheduler(Scheduler):
    """The real scheduler; it writes down each batch's mode and rows, and checks the promises of
    every step's plan (:meth:`check_plan`) as it goes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[tuple[str, list[int], list[int], list[bool]]] = []

    def schedule(self) -> Batch | None:
        batch = super().schedule()
        if batch is not None:
            self.trace.append((batch.mode, [r.rid for r in batch.reqs], list(batch.extend_lens), list(batch.samples)))
            if isinstance(self.batching, ChunkedPrefill):  # (lesson 4's whole prompts postpone decodes)
                self.check_plan(batch)
        return batch

    def check_plan(self, batch: Batch) -> None:
        """What every planned step keeps, whatever the workload: every decoding request gets its
        token (never postponed, even past the budget); no more than ``max_running`` run; and at
        most one prompt is mid-prefill once the step is planned (it took a chunk that does not
        sample, or the budget left it nothing)."""
        rows = dict(zip(batch.reqs, zip(batch.extend_lens, batch.samples)))
        assert len(rows) == batch.size, "a request appears twice in one batch"
        for req in self.running:
            if req.decoding:
                assert rows.get(req, (0,))[0] == 1, f"r{req.rid} is decoding but gets no token this step"
        assert len(self.running) <= self.config.max_running, f"{len(self.running)} running > max_running"
        unfinished = [r.rid for r in self.running if not r.decoding and not rows.get(r, (0, False))[1]]
        assert len(unfinished) <= 1, f"prompts {unfinished} are mid-prefill at once: one chunked prompt at a time"


def make_scheduler(arch: str, budget: int | None, *, prefix_cache: bool = True, num_pages: int = 400,
                   cls: type[Scheduler] = RecordingScheduler, max_running: int = 16) -> Scheduler:
    model = tiny_model(arch)
    pool = PagedKVPool.for_model(model.config, num_pages, 4, torch.float32, "cpu")
    config = EngineConfig(max_running=max_running, max_prefill_tokens=512, max_seq_len=256, prefix_cache=prefix_cache,
                          chunked_prefill_size=budget, overlap=False)
    return build_scheduler(make_engine(model, TorchPagedBackend(pool), config), config,
                           vocab_size=model.config.vocab_size, cls=cls)


def workload(arch: str) -> list[tuple[int, list[int]]]:
    """(arrival step, prompt): a shared 30-token prefix for half of them, lengths 1..60."""
    rng = random.Random(f"l06-{arch}")
    shared = [rng.randrange(8, 512) for _ in range(30)]
    jobs = []
    for i in range(12):
        own = [rng.randrange(8, 512) for _ in range(rng.randint(1, 30 if i % 2 else 60))]
        jobs.append((2 * i, shared + own if i % 2 else own))
    return jobs


def run(sched: Scheduler, jobs: list[tuple[int, list[int]]], params=None, max_steps: int = 5000) -> list[Req]:
    params = params or [SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)] * len(jobs)
    reqs: list[Req] = []
    for step in range(max_steps):
        while len(reqs) < len(jobs) and jobs[len(reqs)][0] <= step:
            reqs.append(sched.add_request(jobs[len(reqs)][1], params[len(reqs)]))
        if len(reqs) == len(jobs) and not sched.has_work:
            return reqs
        sched.step()
        kv = sched.kv
        tree = kv.tree.total_pages if hasattr(kv, "tree") else 0
        owned = sum(len(kv.page_table.pages(r.table_row)) - r.num_tree_pages for r in sched.running)
        assert kv.allocator.num_free + tree + owned == kv.num_pages, "pages leaked or double counted"
    raise AssertionError("the scheduler stopped making progress")


def mismatches(arch: str, jobs, reqs: list[Req]) -> list[int]:
    return [i for i, ((_, p), r) in enumerate(zip(jobs, reqs))
            if tuple(r.output_ids) != hf_greedy_tokens(arch, tuple(p), NEW_TOKENS)]


@pytest.mark.parametrize("budget", [1, 3, 7, 64])
@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_chunked_prefill_matches_hf_alone(arch: str, budget: int) -> None:
    jobs = workload(arch)
    sched = make_scheduler(arch, budget)
    reqs = run(sched, jobs)
    assert mismatches(arch, jobs, reqs) == []
    assert all(distinct_fraction(r.output_ids) > 0.5 for r in reqs)
    modes = {mode for mode, *_ in sched.trace}
    chunked = [i for i, (mode, rids, lens, samples) in enumerate(sched.trace) if not all(samples)]
    if budget < 60:  # the longest prompt of the workload is 60 tokens
        assert chunked, "some prompt must have been split across steps"
    if budget > 1:
        assert "mixed" in modes, "decode tokens and prompt chunks must share a batch"
    for _mode, _rids, lens, samples in sched.trace:  # the budget holds (decode tokens always go)
        decodes = sum(1 for n, s in zip(lens, samples) if n == 1 and s)
        assert sum(lens) <= max(budget, decodes), (lens, budget)


def test_cache_off_and_whole_prompts_agree_with_chunking() -> None:
    arch = "llama"
    jobs = workload(arch)
    outputs = []
    for budget, cache in ((None, False), (5, False), (5, True), (None, True)):
        outputs.append([r.output_ids for r in run(make_scheduler(arch, budget, prefix_cache=cache), jobs)])
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]


def test_seeded_sampling_is_unchanged_by_chunking() -> None:
    """Only the final chunk samples, so a seeded request's generator advances once per token."""
    arch = "qwen3"
    jobs = workload(arch)
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=7 + i, max_tokens=NEW_TOKENS, ignore_eos=True)
              for i in range(len(jobs))]
    whole = [r.output_ids for r in run(make_scheduler(arch, None), jobs, params)]
    for budget in (2, 9):
        assert [r.output_ids for r in run(make_scheduler(arch, budget), jobs, params)] == whole
    assert len({tuple(o) for o in whole}) == len(whole)


def test_a_short_request_is_not_stuck_behind_a_long_prompt() -> None:
    """A 224-token prompt in chunks of 16; a 6-token request arriving at step 3 gets its first
    token in the step it arrives, while the long prompt is still being chunked. Without
    chunking the long prompt is one step, but the short request can only start after it."""
    arch = "qwen2"
    rng = random.Random("fair")
    long = [rng.randrange(8, 512) for _ in range(224)]
    short = [rng.randrange(8, 512) for _ in range(6)]
    jobs = [(0, long), (3, short)]
    sched = make_scheduler(arch, 16)
    reqs = run(sched, jobs)
    assert mismatches(arch, jobs, reqs) == []
    first_token_step = {}
    for step, (_mode, rids, _lens, samples) in enumerate(sched.trace):
        for rid, s in zip(rids, samples):
            if s:
                first_token_step.setdefault(rid, step)
    assert first_token_step[reqs[1].rid] == 3, "the short request samples in the step it arrives"
    assert first_token_step[reqs[0].rid] > 3, "... while the long prompt is still being chunked"
    assert first_token_step[reqs[0].rid] <= 224 // 16 + 2, "and the long prompt is not starved"


def rows_of(sched: RecordingScheduler) -> list[str]:
    """The trace as the smoke script prints it: ``r3:d`` (decode), ``r0:c16`` (a chunk that samples
    nothing), ``r1:p7`` (a prompt or final chunk of 7 tokens, which samples)."""
    out, sampled = [], set()
    for _mode, rids, lens, samples in sched.trace:
        out.append(" ".join(f"r{rid}:d" if rid in sampled else f"r{rid}:{'p' if s else 'c'}{n}"
                            for rid, n, s in zip(rids, lens, samples)))
        sampled.update(rid for rid, s in zip(rids, samples) if s)
    return out


def test_two_long_prompts_take_turns() -> None:
    """Two 40-token prompts arrive a step apart, 8 tokens a step: the second starts only after the
    first's final chunk (one chunked prompt at a time), and the steps are full."""
    arch = "llama"
    rng = random.Random("turns")
    jobs = [(0, [rng.randrange(8, 512) for _ in range(40)]), (1, [rng.randrange(8, 512) for _ in range(40)])]
    sched = make_scheduler(arch, 8)
    reqs = run(sched, jobs)
    assert mismatches(arch, jobs, reqs) == []
    a, b = (f"r{r.rid}" for r in reqs)
    assert rows_of(sched)[:7] == [f"{a}:c8", f"{a}:c8", f"{a}:c8", f"{a}:c8", f"{a}:p8",
                                  f"{a}:d {b}:c7", f"{a}:d {b}:c7"], rows_of(sched)[:7]


def test_every_prompt_that_fits_joins_and_a_cache_hit_costs_only_its_uncached_tokens() -> None:
    """A budget of 16. A 24-token prompt is computed first (its six full pages go into the tree).
    Then two requests arrive together: the same 24 tokens and 4 more (a cache hit: 4 tokens to
    compute) and a 10-token prompt. With the first one's decode token that is 15 tokens: all
    three share one step, and both new requests sample in it."""
    arch = "qwen2"
    rng = random.Random("hit")
    base = [rng.randrange(8, 512) for _ in range(24)]
    jobs = [(0, base), (2, base + [rng.randrange(8, 512) for _ in range(4)]),
            (2, [rng.randrange(8, 512) for _ in range(10)])]
    sched = make_scheduler(arch, 16)
    reqs = run(sched, jobs)
    assert mismatches(arch, jobs, reqs) == []
    r0, r1, r2 = (f"r{r.rid}" for r in reqs)
    assert rows_of(sched)[:3] == [f"{r0}:c16", f"{r0}:p8", f"{r0}:d {r1}:p4 {r2}:p10"], rows_of(sched)[:3]
    assert reqs[1].num_cached_tokens == 24


def test_tight_pool_retracts_and_evicts_mid_prefill_and_stays_identical() -> None:
    """Chunks, the radix cache and a pool too small for everyone: requests are retracted (some
    while half-prefilled) and re-admitted from the cache, and every output still equals HF."""
    arch = "qwen3"
    jobs = [(0, p) for _, p in workload(arch)]
    sched = make_scheduler(arch, 7, num_pages=24)
    half_prefilled = []
    retract = sched.kv.retract

    def watching_retract(req):
        half_prefilled.append(req.num_cached < len(req.prompt_ids))
        retract(req)

    sched.kv.retract = watching_retract
    reqs = run(sched, jobs)
    assert mismatches(arch, jobs, reqs) == []
    assert sched.kv.stats.retractions >= 3 and sched.kv.stats.evicted_pages > 0
    assert any(half_prefilled), "a request must have been retracted in the middle of its prefill"


# --------------------------------------------------------------------------------------------
# Teeth: three chunking bugs, each caught by the parity checks above
# --------------------------------------------------------------------------------------------


class SampleEveryChunk(RecordingScheduler):
    """Bug: a non-final chunk samples a token (and so advances the request)."""

    def build_batch(self, reqs, chunks=None):
        batch = super().build_batch(reqs, chunks)
        batch.samples = [True] * batch.size
        batch.logits_indices = torch.tensor(batch.extend_lens).cumsum(0) - 1
        return batch


class ChunkPositionsOffByOne(RecordingScheduler):
    """Bug: a continuing chunk starts one position late (``num_cached + 1``)."""

    def build_batch(self, reqs, chunks=None):
        batch = super().build_batch(reqs, chunks)
        start = 0
        for req, n, _s in zip(batch.reqs, batch.extend_lens, batch.samples):
            if req.num_cached > 0 and not req.output_ids:
                batch.positions[start:start + n] += 1
            start += n
        return batch


class ForgetCachedPrefix(RecordingScheduler):
    """Bug: a continuing chunk attends only to itself, as if nothing were cached before it."""

    def build_batch(self, reqs, chunks=None):
        batch = super().build_batch(reqs, chunks)
        forgetful = [0 if (r.num_cached > 0 and not r.output_ids) else r.num_cached for r in batch.reqs]
        batch.meta = self.kv.page_table.metadata([r.table_row for r in batch.reqs], forgetful, batch.extend_lens)
        return batch


class SeededGeneratorAdvancedByChunks(RecordingScheduler):
    """Bug: every chunk draws from the request's generator, and the non-final draws are thrown away."""

    def process(self, batch, tokens):
        for req, s in zip(batch.reqs, batch.samples):
            if not s and req.generator is not None:
                torch.rand(1, generator=req.generator)
        return super().process(batch, tokens)


@pytest.mark.parametrize("buggy", [SampleEveryChunk, ChunkPositionsOffByOne])
def test_chunking_bugs_are_caught_by_parity(buggy: type[Scheduler]) -> None:
    arch = "llama"
    jobs = workload(arch)
    try:
        reqs = run(make_scheduler(arch, 5, cls=buggy), jobs)
    except (AssertionError, ValueError, RuntimeError):
        return  # a stray token outgrows the pages its request was given: caught outright
    wrong = mismatches(arch, jobs, reqs)
    assert len(wrong) >= len(jobs) // 2, f"{buggy.__name__}: only {len(wrong)} of {len(jobs)} differ from HF"


def test_a_chunk_that_forgets_its_cached_prefix_is_caught() -> None:
    arch = "llama"
    jobs = workload(arch)
    try:
        reqs = run(make_scheduler(arch, 5, cls=ForgetCachedPrefix), jobs)
    except (AssertionError, ValueError, RuntimeError):
        return  # the metadata no longer describes the chunk: caught outright
    assert len(mismatches(arch, jobs, reqs)) >= len(jobs) // 2


def test_a_generator_advanced_by_non_final_chunks_is_caught() -> None:
    arch = "qwen3"
    jobs = workload(arch)
    params = [SamplingParams(temperature=0.9, seed=3 + i, max_tokens=NEW_TOKENS, ignore_eos=True) for i in range(len(jobs))]
    whole = [r.output_ids for r in run(make_scheduler(arch, None), jobs, params)]
    buggy = [r.output_ids for r in run(make_scheduler(arch, 5, cls=SeededGeneratorAdvancedByChunks), jobs, params)]
    assert sum(a != b for a, b in zip(whole, buggy)) >= len(jobs) // 2


# --------------------------------------------------------------------------------------------
# Faults and aborts in the middle of a chunked prefill
# --------------------------------------------------------------------------------------------


def assert_all_pages_home(sched: Scheduler) -> None:
    kv = sched.kv
    assert not sched.running and not sched.waiting
    assert kv.allocator.num_free + kv.tree.total_pages == kv.num_pages, "pages leaked"
    assert kv.tree.evictable_pages == kv.tree.total_pages, "a tree node is still locked"


def test_a_failing_mixed_batch_fails_alone_and_the_engine_stays_correct(monkeypatch) -> None:
    """A step that mixes decode tokens with a prompt chunk raises: exactly its requests fail
    (the decoding ones and the half-prefilled one), their KV is freed, and the next requests
    still get HF's tokens."""
    arch = "qwen3"
    sched = make_scheduler(arch, 8)
    rng = random.Random("fault")
    short, long = ([rng.randrange(8, 512) for _ in range(n)] for n in (5, 40))
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    first = sched.add_request(short, params)
    sched.step()  # first's prefill: it decodes from now on
    second = sched.add_request(long, params)
    sched.step()  # first decodes, second's first chunk
    assert second.num_cached > 0 and not second.output_ids, "second is half-prefilled"
    forward = sched.engine.forward
    monkeypatch.setattr(sched.engine, "forward", lambda batch: (_ for _ in ()).throw(RuntimeError("injected")))
    failed = sched.step()
    assert failed == [first, second] and all(r.finish_reason == "error" and "injected" in r.error for r in failed)
    assert_all_pages_home(sched)
    monkeypatch.setattr(sched.engine, "forward", forward)
    again = run(sched, [(0, short), (1, long)])
    assert [r.output_ids for r in again] == [list(hf_greedy_tokens(arch, tuple(p), NEW_TOKENS)) for p in (short, long)]
    assert_all_pages_home(sched)


def test_aborting_a_half_prefilled_request_frees_its_pages() -> None:
    arch = "llama"
    sched = make_scheduler(arch, 4)
    prompt = list(range(10, 50))
    req = sched.add_request(prompt, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for _ in range(3):
        sched.step()
    assert 0 < req.num_cached < len(prompt)
    sched.abort(req)
    sched.abort(req)  # twice: frees nothing twice
    assert req.finish_reason == "abort" and req.table_row == -1
    assert_all_pages_home(sched)
    again = run(sched, [(0, prompt)])  # its cached chunks may be reused: still exact
    assert again[0].output_ids == list(hf_greedy_tokens(arch, tuple(prompt), NEW_TOKENS))
    assert again[0].num_cached_tokens > 0, "the aborted request's full pages went into the tree"
