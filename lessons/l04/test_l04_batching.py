"""Lesson 4: continuous batching gives every request exactly the tokens HF gives it alone.

Run: pytest lessons/l04

These tests drive the :class:`~minisgl.scheduler.scheduler.Scheduler` directly, the way a
server does: add a few requests, call ``step()`` a few times, add more while the first ones are
decoding, and so on until everything has finished. Every request's output must equal Hugging
Face generating that request on its own (batch of one). On top of parity they check the things
a batching engine gets wrong: requests that wait for KV, requests that can never fit, aborts,
and that every page comes back. The last test injects three classic batching bugs and shows the
parity check catches each of them.

The sampler, the offline ``LLM`` API and the page table have their own files:
``test_l04_sampling.py``, ``test_l04_llm.py``, ``tests/test_sampler.py`` and
``tests/test_page_table.py``.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import pytest
import torch

from minisgl.attention.paged import ReferencePagedBackend
from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.page_table import PageTable
from minisgl.scheduler.scheduler import RequestTooLongError, Scheduler
from minisgl.testing import distinct_fraction, hf_greedy_tokens, tiny_checkpoint, tiny_model
from tests.tools.exercises import code_under_test

# --------------------------------------------------------------------------------------------
# Building a scheduler, and HF's answers (computed once per process)
# --------------------------------------------------------------------------------------------


def eos_ids(arch: str) -> tuple[int, ...]:
    return tuple(tiny_model(arch).config.eos_token_ids)


@dataclass
class StepRecord:
    mode: str  # "prefill" | "decode"
    rids: list[int]  # requests in the batch, in batch order
    num_tokens: int  # flattened tokens in the forward pass
    decoding_bystanders: list[int]  # running requests not in a prefill batch that already have outputs
    num_waiting: int  # after admission
    num_running: int  # after admission


class RecordingScheduler(Scheduler):
    """The real scheduler; it only writes down what each ``schedule()`` decided."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[StepRecord] = []
        self.admission_order: list[int] = []

    def schedule(self) -> Batch | None:
        batch = super().schedule()
        if batch is not None:
            in_batch = {id(r) for r in batch.reqs}
            bystanders = [r.rid for r in self.running if id(r) not in in_batch and r.output_ids]
            self.trace.append(StepRecord(batch.mode, [r.rid for r in batch.reqs], int(batch.input_ids.numel()),
                                         bystanders, len(self.waiting), len(self.running)))
            if batch.mode == "prefill":
                self.admission_order.extend(r.rid for r in batch.reqs)
        return batch


def make_scheduler(
    arch: str, *, num_pages: int = 1024, page_size: int = 4, max_running: int = 64,
    max_prefill_tokens: int = 256, max_seq_len: int = 512, cls: type[Scheduler] = RecordingScheduler,
) -> Scheduler:
    """A fresh KV pool, reference paged backend and engine around the (shared, stateless) model."""
    model = tiny_model(arch)
    pool = PagedKVPool.for_model(model.config, num_pages, page_size, torch.float32, "cpu")
    config = EngineConfig(max_running=max_running, max_prefill_tokens=max_prefill_tokens, max_seq_len=max_seq_len,
                          prefix_cache=False, chunked_prefill_size=None, overlap=False)  # lesson 4: exclusive pages
    engine = make_engine(model, ReferencePagedBackend(pool), config)
    return build_scheduler(engine, config, eos_ids(arch), model.config.vocab_size, cls=cls)


def random_prompt(rng: random.Random, lo: int, hi: int) -> list[int]:
    """Random ids above the special tokens (the tiny vocabularies keep specials below 8)."""
    return [rng.randrange(8, 512) for _ in range(rng.randint(lo, hi))]


@functools.cache
def prompts_ending_in_eos(arch: str, max_tokens: int, per_id: int = 1) -> tuple[tuple[int, ...], ...]:
    """Prompts whose HF greedy run emits an EOS id within ``max_tokens``, ``per_id`` for each EOS id.

    With random weights an EOS id is rare (a few percent of random prompts within 48 tokens), so
    we search a fixed, seeded list of candidates with HF, which is cheap for the tiny model.
    """
    rng = random.Random(f"eos-{arch}")
    found: dict[int, list[tuple[int, ...]]] = {e: [] for e in eos_ids(arch)}
    for _ in range(600):
        prompt = tuple(random_prompt(rng, 3, 40))
        free_run = hf_greedy_tokens(arch, prompt, max_tokens)
        first = next((t for t in free_run if t in found), None)
        if first is not None and len(found[first]) < per_id:
            found[first].append(prompt)
        if all(len(v) >= per_id for v in found.values()):
            break
    return tuple(p for v in found.values() for p in v)


@dataclass
class Job:
    """One request of a workload: when it arrives (scheduler step), what it asks, what HF says."""

    arrival: int
    prompt: list[int]
    params: SamplingParams
    expected: tuple[int, ...]
    req: Req | None = None


def expected_tokens(arch: str, prompt: list[int], params: SamplingParams, eos: tuple[int, ...]) -> tuple[int, ...]:
    stop = tuple(params.stop_token_ids) + (() if params.ignore_eos else eos)
    return hf_greedy_tokens(arch, tuple(prompt), params.max_tokens, stop or None)


def run_jobs(sched: Scheduler, jobs: list[Job], check_invariants: bool = True, max_steps: int = 5000) -> int:
    """Add each job at its arrival step, ``step()`` until all are done; returns the step count."""
    jobs = sorted(jobs, key=lambda j: j.arrival)
    step, next_job = 0, 0
    while next_job < len(jobs) or sched.has_work:
        while next_job < len(jobs) and jobs[next_job].arrival <= step:
            job = jobs[next_job]
            job.req = sched.add_request(job.prompt, job.params)
            next_job += 1
        sched.step()
        step += 1
        if check_invariants:
            assert_kv_accounting(sched)
        assert step < max_steps, "the scheduler stopped making progress"
    return step


def drain(sched: Scheduler, max_steps: int = 2000) -> None:
    """Step until nothing is left, failing (instead of hanging) if the scheduler gets stuck."""
    for _ in range(max_steps):
        if not sched.has_work:
            return
        sched.step()
    raise AssertionError(f"still busy after {max_steps} steps: {len(sched.waiting)} waiting, {len(sched.running)} running")


def assert_kv_accounting(sched: Scheduler) -> None:
    """Every page is either free or owned by exactly one running request; rows likewise."""
    kv = sched.kv
    owned = [p for r in sched.running for p in kv.page_table.pages(r.table_row)]
    assert len(owned) == len(set(owned)), "a page is owned by two running requests"
    assert kv.allocator.num_free + len(owned) == sched.num_pages, "pages leaked or double counted"
    assert kv.page_table.num_free_rows + len(sched.running) == sched.config.max_running, "page-table rows leaked"
    for r in sched.running:
        assert len(kv.page_table.pages(r.table_row)) == kv.pages_needed(r.length_limit)


def assert_all_freed(sched: Scheduler) -> None:
    kv = sched.kv
    assert not sched.waiting and not sched.running
    assert kv.allocator.num_free == sched.num_pages, "every page comes back"
    assert kv.page_table.num_free_rows == sched.config.max_running, "every page-table row comes back"
    assert int(kv.page_table.num_pages.sum()) == 0


def assert_outputs_match(jobs: list[Job], label: str) -> None:
    for job in jobs:
        req = job.req
        assert req is not None and req.status == ReqStatus.FINISHED
        assert tuple(req.output_ids) == job.expected, (
            f"{label}: request {req.rid} (prompt {len(job.prompt)} tokens, max_tokens {job.params.max_tokens}, "
            f"arrived at step {job.arrival}) differs from HF run alone"
        )
        stopped = bool(req.output_ids) and req.output_ids[-1] in req.stop_ids
        assert req.finish_reason == ("stop" if stopped else "length")


# --------------------------------------------------------------------------------------------
# Parity: many requests joining and leaving mid-flight
# --------------------------------------------------------------------------------------------


def mixed_workload(arch: str) -> list[Job]:
    """36+ requests: prompts of 1..60 tokens, max_tokens mostly 32..64 (a few short ones that
    leave early), arriving in waves while earlier requests decode. Llama gets EOS-stopping
    requests for both of its EOS ids; Qwen3 (whose EOS the random model never emits) gets user
    stop ids taken from HF's own free run."""
    rng = random.Random(f"mixed-{arch}")
    eos = eos_ids(arch)
    jobs: list[Job] = []
    arrival = 0
    for i in range(36):
        if i >= 8 and i % 4 == 0:
            arrival += rng.randint(2, 6)  # a wave every few steps, after the first 8 requests
        prompt = random_prompt(rng, 1, 60)
        max_tokens = rng.randint(4, 16) if i % 6 == 5 else rng.randint(32, 64)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        if arch == "qwen3" and i % 9 == 4:
            free_run = hf_greedy_tokens(arch, tuple(prompt), max_tokens)
            stop = free_run[rng.randint(5, 20)]
            params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[stop])  # EOS stays on as well
        jobs.append(Job(arrival, prompt, params, ()))
    if arch == "llama":  # requests that really stop on each of Llama 3's EOS ids, mid-stream
        for k, prompt in enumerate(prompts_ending_in_eos(arch, 48)):
            jobs.append(Job(3 + 4 * k, list(prompt), SamplingParams(max_tokens=48), ()))
    for job in jobs:
        job.expected = expected_tokens(arch, job.prompt, job.params, eos)
    return jobs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_requests_joining_and_leaving_match_hf_alone(arch: str) -> None:
    jobs = mixed_workload(arch)
    sched = make_scheduler(arch)
    steps = run_jobs(sched, jobs)
    assert_outputs_match(jobs, arch)
    assert_all_freed(sched)

    # Teeth: the workload really is varied, and the generations are not degenerate.
    assert len(jobs) >= 32
    assert len({len(j.prompt) for j in jobs}) >= 20 and len({j.params.max_tokens for j in jobs}) >= 15
    long_runs = [j.req.output_ids for j in jobs if j.params.ignore_eos and j.params.max_tokens >= 32]
    assert len(long_runs) >= 20 and all(distinct_fraction(out) > 0.5 for out in long_runs)
    stopped = [j.req for j in jobs if j.req.finish_reason == "stop"]
    assert len(stopped) >= 2, "some requests must stop early on a stop id"
    if arch == "llama":  # both EOS ids (<|end_of_text|> and <|eot_id|>) end a request
        assert {r.output_ids[-1] for r in stopped} >= set(eos_ids(arch))

    # The batches really mixed: big decode batches, and requests admitted while others decode.
    trace = sched.trace
    decode_sizes = [len(s.rids) for s in trace if s.mode == "decode"]
    assert max(decode_sizes) >= 8, decode_sizes
    joins = [s for s in trace if s.mode == "prefill" and s.decoding_bystanders]
    assert len(joins) >= 5, "requests must join while others are mid-decode"
    assert any(len(s.rids) >= 2 for s in trace if s.mode == "prefill"), "prefills must be batched (ragged)"
    # ... and requests left mid-flight: someone finished while a later request was still to arrive.
    finish_step = {}
    for i, s in enumerate(trace):
        for rid in s.rids:
            finish_step[rid] = i
    last_join = max(i for i, s in enumerate(trace) if s.mode == "prefill")
    assert any(step < last_join for step in finish_step.values()), "requests must leave mid-flight"
    assert steps < sum(j.params.max_tokens for j in jobs) / 4, "batching must save steps"


def test_tiny_kv_pool_makes_requests_wait_and_still_matches() -> None:
    """A pool that holds only 2-3 requests at a time: the rest wait, FIFO, and nothing changes."""
    arch, page_size, num_pages = "qwen2", 4, 30
    rng = random.Random("tiny-pool")
    jobs = [Job(0 if i < 6 else 2 * i, random_prompt(rng, 4, 28),
                SamplingParams(max_tokens=rng.randint(32, 40), ignore_eos=True), ())
            for i in range(10)]
    for job in jobs:
        job.expected = expected_tokens(arch, job.prompt, job.params, eos_ids(arch))
    sched = make_scheduler(arch, num_pages=num_pages, page_size=page_size, max_running=8)
    need = [sched.kv.pages_needed(len(j.prompt) + j.params.max_tokens) for j in jobs]
    assert max(need) <= num_pages < 4 * min(need), need  # each fits alone, never four at once

    run_jobs(sched, jobs)
    assert_outputs_match(jobs, "tiny pool")
    assert_all_freed(sched)
    trace = sched.trace
    assert any(s.num_waiting > 0 and s.num_running > 0 for s in trace), "requests must have waited"
    assert max(s.num_running for s in trace) <= 3
    assert any(s.mode == "prefill" and s.decoding_bystanders for s in trace), "a waiting request joins a running batch"
    assert sched.admission_order == sorted(sched.admission_order), "first come, first served"


def test_request_filling_the_whole_pool_runs() -> None:
    """The boundary: prompt + max_tokens == the pool's capacity is accepted and completes."""
    arch = "qwen3"
    sched = make_scheduler(arch, num_pages=8, page_size=4)
    prompt = random_prompt(random.Random("whole-pool"), 16, 16)
    job = Job(0, prompt, SamplingParams(max_tokens=16, ignore_eos=True), hf_greedy_tokens(arch, tuple(prompt), 16))
    run_jobs(sched, [job])
    assert_outputs_match([job], "whole pool")
    assert_all_freed(sched)


# --------------------------------------------------------------------------------------------
# Requests that can never run, and aborts
# --------------------------------------------------------------------------------------------


def scheduler_state(sched: Scheduler) -> tuple:
    kv = sched.kv
    return ([r.rid for r in sched.waiting], [r.rid for r in sched.running], kv.allocator.num_free,
            kv.page_table.num_free_rows, kv.page_table.num_pages.tolist())


def test_impossible_requests_are_rejected_at_once_and_change_nothing() -> None:
    arch = "qwen3"
    sched = make_scheduler(arch, num_pages=8, page_size=4, max_seq_len=64)  # the pool holds 32 tokens
    rng = random.Random("reject")
    running = Job(0, random_prompt(rng, 6, 6), SamplingParams(max_tokens=10, ignore_eos=True), ())
    waiting = Job(0, random_prompt(rng, 12, 12), SamplingParams(max_tokens=12, ignore_eos=True), ())
    for job in (running, waiting):
        job.expected = hf_greedy_tokens(arch, tuple(job.prompt), job.params.max_tokens)
        job.req = sched.add_request(job.prompt, job.params)
    sched.step()
    sched.step()
    assert [r.rid for r in sched.running] == [running.req.rid] and list(sched.waiting) == [waiting.req]
    before = scheduler_state(sched)

    with pytest.raises(RequestTooLongError, match="whole pool"):
        sched.add_request(list(range(8, 28)), SamplingParams(max_tokens=13))  # 33 tokens > 32 in the pool
    with pytest.raises(RequestTooLongError, match="maximum sequence length 64"):
        sched.add_request(list(range(8, 18)), SamplingParams(max_tokens=60))
    with pytest.raises(ValueError, match="empty"):
        sched.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="vocabulary"):
        sched.add_request([8, 9, 512], SamplingParams())
    bad = SamplingParams()
    bad.temperature = -1.0  # mutated after construction: add_request validates again
    with pytest.raises(ValueError, match="temperature"):
        sched.add_request([8, 9], bad)
    assert scheduler_state(sched) == before, "a rejected request must leave no trace"

    drain(sched)
    assert_outputs_match([running, waiting], "after rejections")
    assert_all_freed(sched)


def test_abort_frees_kv_of_waiting_and_running_requests() -> None:
    arch = "llama"
    sched = make_scheduler(arch, num_pages=24, page_size=4, max_running=8)
    rng = random.Random("abort")
    jobs = [Job(0, random_prompt(rng, 5, 20), SamplingParams(max_tokens=rng.randint(32, 40), ignore_eos=True), ())
            for _ in range(5)]
    for job in jobs:
        job.expected = hf_greedy_tokens(arch, tuple(job.prompt), job.params.max_tokens)
        job.req = sched.add_request(job.prompt, job.params)
    for _ in range(4):
        sched.step()
    assert len(sched.running) >= 2 and len(sched.waiting) >= 2, "need both running and waiting requests"
    victim_running, victim_waiting = sched.running[0], sched.waiting[-1]
    assert victim_running.output_ids, "abort a request that is mid-decode"

    free_before = sched.kv.allocator.num_free
    sched.abort(victim_waiting)
    assert sched.kv.allocator.num_free == free_before, "a waiting request owns no KV"
    sched.abort(victim_running)
    assert sched.kv.allocator.num_free == free_before + sched.kv.pages_needed(victim_running.length_limit)
    assert_kv_accounting(sched)
    for victim in (victim_running, victim_waiting):
        assert victim.status == ReqStatus.FINISHED and victim.finish_reason == "abort"
        assert victim not in sched.running and victim not in sched.waiting
    sched.abort(victim_running)  # aborting twice is harmless (no double free)
    assert_kv_accounting(sched)

    # Abort a request while its batch is "on the device": its sampled token is dropped.
    batch = sched.schedule()
    tokens = sched.engine.step(batch)
    in_flight = batch.reqs[-1]
    n_out = len(in_flight.output_ids)
    sched.abort(in_flight)
    sched.process(batch, tokens)
    assert len(in_flight.output_ids) == n_out and in_flight.finish_reason == "abort"
    assert_kv_accounting(sched)

    drain(sched)
    survivors = [j for j in jobs if j.req.finish_reason != "abort"]
    assert len(survivors) == 2
    assert_outputs_match(survivors, "after aborts")
    assert_all_freed(sched)


# --------------------------------------------------------------------------------------------
# Teeth: classic batching bugs, injected, must be caught by the parity check
# --------------------------------------------------------------------------------------------


class FlatPositionsScheduler(RecordingScheduler):
    """Bug: positions numbered along the flattened token stream instead of within each request
    (request 2's prompt continues at request 1's length; a decode batch gets positions 0..B-1)."""

    def build_batch(self, reqs: list[Req], chunks: list[int] | None = None) -> Batch:
        batch = super().build_batch(reqs, chunks)
        batch.positions = torch.arange(batch.input_ids.numel())
        return batch


class FirstTokenLogitsScheduler(RecordingScheduler):
    """Bug: logits taken at each request's *first* new token instead of its last."""

    def build_batch(self, reqs: list[Req], chunks: list[int] | None = None) -> Batch:
        batch = super().build_batch(reqs, chunks)
        batch.logits_indices = batch.meta.qo_indptr[:-1].long()
        return batch


class RolledPageTable(PageTable):
    """Bug: request i is given the pages of request i+1 (rows paired with the wrong request)."""

    def metadata(self, rows, num_cached, num_new):
        rows = list(rows)
        return super().metadata(rows[1:] + rows[:1], num_cached, num_new)


class RolledPagesScheduler(RecordingScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        old = self.kv.page_table
        self.kv.page_table = RolledPageTable(old.table.shape[0], old.table.shape[1], old.page_size)


def teeth_workload(arch: str) -> list[Job]:
    """12 requests, prompts of 2..30 tokens, all reserving the same number of pages (so the
    rolled page table stays in bounds), arriving in three waves."""
    rng = random.Random(f"teeth-{arch}")
    jobs = []
    for i in range(12):
        prompt = random_prompt(rng, 2, 30)
        params = SamplingParams(max_tokens=64 - len(prompt), ignore_eos=True)  # prompt + max_tokens = 64
        jobs.append(Job(3 * (i // 4), prompt, params, hf_greedy_tokens(arch, tuple(prompt), params.max_tokens)))
    return jobs


@pytest.mark.parametrize("buggy", [FlatPositionsScheduler, FirstTokenLogitsScheduler, RolledPagesScheduler])
def test_parity_check_catches_batching_bugs(buggy: type[Scheduler]) -> None:
    arch = "llama"
    jobs = teeth_workload(arch)
    control = make_scheduler(arch)  # the same workload through the scheduler under test passes first
    run_jobs(control, jobs)
    assert_outputs_match(jobs, f"control run on {code_under_test(4)}")

    sched = make_scheduler(arch, cls=buggy)
    run_jobs(sched, jobs, check_invariants=False)
    wrong = sum(tuple(j.req.output_ids) != j.expected for j in jobs)
    assert wrong >= len(jobs) * 3 // 4, f"{buggy.__name__}: only {wrong}/{len(jobs)} requests differ from HF"


class EarlyFreeScheduler(RecordingScheduler):
    """Bug: a request's pages go back to the allocator when its second-to-last token is
    sampled, one step before its last decode reads them. A request admitted in between is
    handed those pages and overwrites them: a freed page reused while still referenced.
    (Its row is released normally at the end, so the allocator sees no double free.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.freed_early: set[int] = set()
        self.most_shared_pages = 0  # evidence that two live requests really shared pages

    def process(self, batch: Batch, tokens: list[int]) -> list[Req]:
        finished = super().process(batch, tokens)
        for req in self.running:
            if len(req.output_ids) == req.params.max_tokens - 1 and req.rid not in self.freed_early:
                self.kv.allocator.free(self.kv.page_table.pages(req.table_row))
                self.freed_early.add(req.rid)
        return finished

    def _finish(self, req: Req, reason: str) -> None:
        if req.rid in self.freed_early and req.table_row >= 0:
            self.kv.page_table.free_row(req.table_row)  # its pages were already given back
            req.table_row = -1
        super()._finish(req, reason)

    def step(self) -> list[Req]:
        owned = [p for r in self.running for p in self.kv.page_table.pages(r.table_row)]
        self.most_shared_pages = max(self.most_shared_pages, len(owned) - len(set(owned)))
        return super().step()


def test_parity_check_catches_a_freed_page_reused() -> None:
    """A pool of exactly two requests (32 pages of 4): a waiting request gets the freed pages at once."""
    arch = "llama"
    jobs = teeth_workload(arch)
    control = make_scheduler(arch, num_pages=32)
    run_jobs(control, jobs)
    assert_outputs_match(jobs, f"control run on {code_under_test(4)}")

    sched = make_scheduler(arch, num_pages=32, cls=EarlyFreeScheduler)
    run_jobs(sched, jobs, check_invariants=False)
    assert sched.most_shared_pages > 0, "the injected bug never shared a page (the test lost its teeth)"
    wrong = sum(tuple(j.req.output_ids) != j.expected for j in jobs)
    assert wrong >= len(jobs) // 2, f"only {wrong}/{len(jobs)} requests differ from HF"
    # The page accounting checked after every step sees it too: a freed page still in a row.
    with pytest.raises(AssertionError, match="pages leaked or double counted"):
        run_jobs(make_scheduler(arch, num_pages=32, cls=EarlyFreeScheduler), teeth_workload(arch))


def test_bad_config_and_stalls_are_errors_not_hangs() -> None:
    """A scheduler that has work but can schedule nothing must say so, not spin forever."""
    from minisgl import LLM

    with pytest.raises(ValueError, match="max_running"):
        EngineConfig(max_running=0)
    llm = LLM(tiny_checkpoint("qwen3"), num_pages=16, page_size=4, prefix_cache=False, chunked_prefill_size=None, overlap=False)
    leaked = llm.scheduler.kv.allocator.alloc(15)  # simulate a KV leak: one page left
    with pytest.raises(RuntimeError, match="stalled"):
        llm.generate(["Hello there, this prompt needs more than one page"], SamplingParams(max_tokens=4), progress=False)
    llm.scheduler.kv.allocator.free(leaked)
