"""Lesson 7: overlap scheduling changes when the host works, never which tokens come out.

Run: pytest lessons/l07

With ``overlap=True`` a step launches batch N+1 and only then processes batch N's results. The
scheduler plans N+1 without N's tokens: a decode row's input comes from the engine's device
token buffer, and a request that finished at N may already sit in N+1 (its extra token is
dropped, its KV freed once, after N+1). These tests compare overlap on, off and HF with
requests joining and leaving, stop tokens, ``max_tokens`` stops, aborts in flight, chunked
prefill and retraction, count every page free, and inject the three classic overlap bugs.
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.attention.paged import TorchPagedBackend
from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.engine.staging import PinnedStaging
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.scheduler.scheduler import Scheduler
from minisgl.testing import distinct_fraction, hf_greedy_tokens, tiny_checkpoint, tiny_model

NEW_TOKENS = 16


class CountingScheduler(Scheduler):
    """The real scheduler; it counts final releases (of finished requests' KV) per request,
    records those made while a launched, unprocessed batch still holds the request (there must
    be none) and how many batches were in flight at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.releases: dict[int, int] = {}
        self.early_releases: list[int] = []
        self.max_in_flight = 0
        release = self.kv.release_request
        in_flight = getattr(self.loop, "in_flight", ())  # lesson 4's loop keeps nothing in flight

        def counting_release(req: Req, cache: bool = True) -> None:
            if req.table_row >= 0 and req.status == ReqStatus.FINISHED:  # a final release
                self.releases[req.rid] = self.releases.get(req.rid, 0) + 1
                if any(req in batch.reqs for batch, _ in in_flight):
                    self.early_releases.append(req.rid)
            release(req, cache=cache)

        self.kv.release_request = counting_release
        # Batches in flight right after each launch (the lagged loop's engine.launch), or 1 for
        # each batch the synchronous loop runs (engine.step).
        name = "launch" if hasattr(self.engine, "launch") else "step"
        run_batch = getattr(self.engine, name)

        def counting_run(batch: Batch):
            out = run_batch(batch)
            self.max_in_flight = max(self.max_in_flight, len(in_flight) + 1 if name == "launch" else 1)
            return out

        setattr(self.engine, name, counting_run)


def make_scheduler(arch: str, *, overlap: bool, budget: int | None = 8, num_pages: int = 400,
                   cls: type[Scheduler] = CountingScheduler) -> Scheduler:
    model = tiny_model(arch)
    pool = PagedKVPool.for_model(model.config, num_pages, 4, torch.float32, "cpu")
    config = EngineConfig(max_running=16, max_prefill_tokens=512, max_seq_len=256, chunked_prefill_size=budget,
                          overlap=overlap)
    return build_scheduler(make_engine(model, TorchPagedBackend(pool), config), config,
                           vocab_size=model.config.vocab_size, cls=cls)


def workload(arch: str, n: int = 10) -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params): lengths 1..40, varied max_tokens, half of them with a stop
    token taken from HF's own output (so they stop early, at different steps)."""
    rng = random.Random(f"l07-{arch}")
    jobs = []
    for i in range(n):
        prompt = [rng.randrange(8, 512) for _ in range(rng.randint(1, 40))]
        max_tokens = rng.randint(3, NEW_TOKENS)
        stop: list[int] = []
        if i % 2:
            ref = hf_greedy_tokens(arch, tuple(prompt), max_tokens)
            stop = [ref[rng.randrange(1, len(ref))]]
        jobs.append((rng.randint(0, 12), prompt, SamplingParams(max_tokens=max_tokens, stop_token_ids=stop, ignore_eos=True)))
    jobs.sort(key=lambda j: j[0])
    return jobs


def expected(arch: str, prompt: list[int], params: SamplingParams) -> list[int]:
    stop = tuple(params.stop_token_ids) or None
    return list(hf_greedy_tokens(arch, tuple(prompt), params.max_tokens, stop_token_ids=stop))


def assert_pages_home(sched: Scheduler) -> None:
    kv = sched.kv
    assert not sched.running and not sched.waiting and not sched.loop.busy
    early = getattr(sched, "early_releases", [])
    assert not early, f"KV of finished requests {early} freed while a launched batch still held them"
    tree = kv.tree.total_pages if hasattr(kv, "tree") else 0
    assert kv.allocator.num_free + tree == kv.num_pages, "pages leaked"
    if hasattr(kv, "tree"):
        assert kv.tree.protected_pages == 0, "a tree node is still locked"


def run(sched: Scheduler, jobs, abort_at: dict[int, int] | None = None, max_steps: int = 3000) -> list[Req]:
    """Drive ``sched`` step by step; job ``i`` arrives at its step; ``abort_at[i]`` aborts it then."""
    abort_at = abort_at or {}
    reqs: list[Req] = []
    for step in range(max_steps):
        while len(reqs) < len(jobs) and jobs[len(reqs)][0] <= step:
            _, prompt, params = jobs[len(reqs)]
            reqs.append(sched.add_request(prompt, params))
        for i, when in abort_at.items():
            if when == step and i < len(reqs):
                sched.abort(reqs[i])
        if len(reqs) == len(jobs) and not sched.has_work:
            assert_pages_home(sched)
            return reqs
        sched.step()
    raise AssertionError("the scheduler stopped making progress")


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_overlap_on_off_and_hf_give_the_same_tokens(arch: str) -> None:
    jobs = workload(arch)
    outputs = {}
    for overlap in (False, True):
        sched = make_scheduler(arch, overlap=overlap)
        reqs = run(sched, jobs)
        outputs[overlap] = [r.output_ids for r in reqs]
        assert all(n == 1 for n in sched.releases.values()) and len(sched.releases) == len(jobs), "one release each"
        assert [r.finish_reason for r in reqs].count("stop") >= 3, "stop tokens must end some requests early"
        if overlap:
            assert sched.max_in_flight == 2, "batch N+1 must have been launched before N was processed"
    assert outputs[True] == outputs[False]
    assert outputs[True] == [expected(arch, p, params) for _, p, params in jobs]
    assert distinct_fraction([t for o in outputs[True] for t in o]) > 0.3


def test_overlap_with_whole_prompts_and_cache_off() -> None:
    arch = "llama"
    jobs = workload(arch)
    model = tiny_model(arch)
    outs = []
    for overlap in (False, True):
        pool = PagedKVPool.for_model(model.config, 400, 4, torch.float32, "cpu")
        config = EngineConfig(max_running=16, max_prefill_tokens=512, max_seq_len=256, prefix_cache=False,
                              chunked_prefill_size=None, overlap=overlap)
        sched = build_scheduler(make_engine(model, TorchPagedBackend(pool), config), config,
                                vocab_size=model.config.vocab_size, cls=CountingScheduler)
        outs.append([r.output_ids for r in run(sched, jobs)])
    assert outs[0] == outs[1] == [expected(arch, p, params) for _, p, params in jobs]


def test_aborts_in_flight_free_everything_exactly_once() -> None:
    """Abort requests while their batch is in flight (including one that finishes in that very
    batch): each is released once, after the batch in flight is processed; the others are
    untouched."""
    arch = "qwen3"
    jobs = [(0, p, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
            for p in ([10, 11, 12], list(range(20, 45)), [7] * 9, list(range(100, 130)))]
    sched = make_scheduler(arch, overlap=True)
    reqs = run(sched, jobs, abort_at={0: 4, 2: 5, 3: 1})
    assert [r.finish_reason for r in reqs] == ["abort", "length", "abort", "abort"]
    assert all(n == 1 for n in sched.releases.values())
    assert reqs[1].output_ids == expected(arch, jobs[1][1], jobs[1][2])
    assert 0 < len(reqs[0].output_ids) < NEW_TOKENS


def test_tight_pool_retracts_under_overlap_and_stays_identical() -> None:
    arch = "qwen2"
    jobs = [(0, p, params) for _, p, params in workload(arch, 12)]
    sched = make_scheduler(arch, overlap=True, budget=6, num_pages=16)
    reqs = run(sched, jobs)
    assert sched.kv.stats.retractions >= 2
    assert [r.output_ids for r in reqs] == [expected(arch, p, params) for _, p, params in jobs]


def test_llm_overlap_is_the_default_and_matches_the_synchronous_loop() -> None:
    path = tiny_checkpoint("qwen3")
    rng = random.Random("llm")
    prompts = [[rng.randrange(8, 512) for _ in range(rng.randint(2, 30))] for _ in range(6)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 9, 1, 12, 5, 7)]
    seeded = [SamplingParams(temperature=0.8, seed=i, max_tokens=8) for i in range(6)]
    outs = {}
    for overlap in (True, False):
        llm = LLM(path, num_pages=128, page_size=4, max_running=4, max_seq_len=64, overlap=overlap)
        assert llm.scheduler.config.overlap is overlap
        outs[overlap] = ([o.token_ids for o in llm.generate(prompts, params, progress=False)],
                         [o.token_ids for o in llm.generate(prompts, seeded, progress=False)])
        assert_pages_home(llm.scheduler)
    assert outs[True] == outs[False]
    assert outs[True][0] == [list(hf_greedy_tokens("qwen3", tuple(p), s.max_tokens)) for p, s in zip(prompts, params)]


def test_a_failing_batch_under_overlap_fails_alone(monkeypatch) -> None:
    arch = "qwen3"
    sched = make_scheduler(arch, overlap=True)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    first = sched.add_request([5, 6, 7, 8], params)
    sched.step()
    sched.step()  # first is decoding, with a batch in flight
    forward = sched.engine.forward
    monkeypatch.setattr(sched.engine, "forward", lambda batch: (_ for _ in ()).throw(RuntimeError("injected")))
    failed = sched.step()
    assert failed == [first] and first.finish_reason == "error"
    for _ in range(10):  # the batch in flight is processed; the failed request's token is dropped
        if not sched.has_work:
            break
        sched.step()
    assert_pages_home(sched)
    monkeypatch.setattr(sched.engine, "forward", forward)
    again = run(sched, [(0, [5, 6, 7, 8], params)])
    assert again[0].output_ids == expected(arch, [5, 6, 7, 8], params)


def test_aborting_mid_chunk_waits_for_the_chunk_in_flight() -> None:
    """Abort a 30-token prompt at every point of its life (chunks of 8 in flight, its final chunk,
    its decode steps): a launched batch that holds it, even a chunk that samples nothing, keeps
    its KV until that batch is processed; then it is freed exactly once."""
    arch = "llama"
    prompt = list(range(40, 70))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for abort_after in range(1, 7):
        sched = make_scheduler(arch, overlap=True)
        req = sched.add_request(prompt, params)
        for _ in range(abort_after):
            sched.step()
        held = sched.loop.busy and any(req in batch.reqs for batch, _ in sched.loop.in_flight)
        sched.abort(req)
        assert (req.table_row >= 0) == held, f"after {abort_after} steps: freed under a batch in flight"
        run(sched, [])  # processes what is in flight, checks every page is home and no early release
        assert sched.releases == {req.rid: 1}
        if abort_after <= 3:
            assert 0 < req.num_cached < len(prompt) and not req.output_ids, "aborted mid-prefill"


def test_flush_processes_the_batch_still_in_flight() -> None:
    """A request that stops at batch N already sits in batch N+1, launched before N was
    processed: its KV waits for N+1. ``flush`` processes N+1 at once (the extra token is
    dropped, the KV freed once), the loop is idle, and the other request goes on exactly."""
    arch = "qwen3"
    a_prompt, b_prompt = [9, 10, 11, 12, 13], list(range(60, 80))
    ref = hf_greedy_tokens(arch, tuple(a_prompt), NEW_TOKENS)
    stop = SamplingParams(max_tokens=NEW_TOKENS, stop_token_ids=[ref[3]], ignore_eos=True)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    sched = make_scheduler(arch, overlap=True)
    a, b = sched.add_request(a_prompt, stop), sched.add_request(b_prompt, params)
    for _ in range(20):
        if a in sched.step():
            break
    assert a.finish_reason == "stop" and a.output_ids == expected(arch, a_prompt, stop)
    assert sched.loop.busy and a.table_row >= 0, "the next batch, launched before a stopped, still holds it"
    sched.flush()
    assert not sched.loop.busy, "flush leaves nothing in flight"
    assert a.table_row == -1 and sched.releases == {a.rid: 1}
    assert b.output_ids and not b.pending, "b's token from the flushed batch is processed"
    run(sched, [])
    assert b.output_ids == expected(arch, b_prompt, params) and sched.releases == {a.rid: 1, b.rid: 1}


def test_nothing_can_run_and_nothing_in_flight_is_a_stall() -> None:
    """Work that can never be scheduled (here: every page taken behind the scheduler's back)
    and no batch in flight: the lagged loop raises instead of spinning."""
    sched = make_scheduler("qwen3", overlap=True)
    sched.kv.allocator.alloc(sched.kv.allocator.num_free)  # a leak
    sched.add_request([5, 6, 7], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match="scheduler stalled"):
        sched.step()


# --------------------------------------------------------------------------------------------
# Teeth: the three classic overlap bugs
# --------------------------------------------------------------------------------------------


class StaleHostInputs(CountingScheduler):
    """Bug: step N+1's decode inputs are built from the host's copy of the tokens, which is one
    step stale (the latest token is still on the device)."""

    def build_batch(self, reqs, chunks=None):
        batch = super().build_batch(reqs, chunks)
        for at, req in zip(batch.device_token_at.tolist(), [r for r in batch.reqs if r.pending]):
            batch.input_ids[at] = req.all_ids[-1]  # the newest token the host has: the previous one
        batch.device_token_at = batch.device_token_rows = torch.zeros(0, dtype=torch.int64)
        return batch


class ReleaseTwice(CountingScheduler):
    """Bug: a request that finishes while a later batch still holds it is released at once
    (and, as before, again when that batch is processed)."""

    def _finish(self, req, reason):
        deferred, row = req.inflight > 0, req.table_row
        super()._finish(req, reason)
        if deferred:
            self.kv.release_request(req, cache=False)  # too early ...
            req.table_row = row  # ... and the row is still written down, so it is released again


def test_stale_host_inputs_are_caught() -> None:
    arch = "llama"
    jobs = workload(arch)
    reqs = run(make_scheduler(arch, overlap=True, cls=StaleHostInputs), jobs)
    wrong = [i for i, (r, (_, p, params)) in enumerate(zip(reqs, jobs)) if r.output_ids != expected(arch, p, params)]
    assert len(wrong) >= len(jobs) // 2


def test_double_release_is_caught() -> None:
    arch = "qwen3"
    with pytest.raises((ValueError, RuntimeError, AssertionError)) as caught:
        run(make_scheduler(arch, overlap=True, cls=ReleaseTwice), workload(arch))
    print(f"caught: {caught.value}")  # the allocator or the tree refuses a page it does not own


class DeferredCopyStaging(PinnedStaging):
    """A CPU stand-in for an asynchronous copy: the copy out of the staging buffer happens only
    when its event is waited on (or when the 'device' finally gets to it, ``drain``)."""

    def __init__(self, guard: bool) -> None:
        super().__init__("cpu", num_slots=1)
        self.guard = guard
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _copy(self, src):
        dst = torch.empty_like(src)
        self.pending.append((src, dst))
        return dst, len(self.pending) - 1

    def _wait(self, event):
        if self.guard:
            self.drain()

    def drain(self) -> None:
        for src, dst in self.pending:
            dst.copy_(src)
        self.pending.clear()


@pytest.mark.parametrize("guard", [True, False])
def test_a_staging_buffer_is_never_rewritten_before_its_copy(guard: bool) -> None:
    staging = DeferredCopyStaging(guard)
    first = staging.to_device([torch.tensor([1, 2, 3]), torch.tensor([4])])
    second = staging.to_device([torch.tensor([7, 8, 9]), torch.tensor([6])])
    staging.drain()
    got = [t.tolist() for t in first + second]
    if guard:
        assert got == [[1, 2, 3], [4], [7, 8, 9], [6]] and staging.guarded_reuses == 1
    else:  # the race: batch N's copy reads batch N+1's indices
        assert got[:2] == [[7, 8, 9], [6]]


def test_each_batch_keeps_its_own_attention_plan() -> None:
    """Planning batch N+1 must not change what batch N's plan holds."""
    model = tiny_model("qwen3")
    pool = PagedKVPool.for_model(model.config, 16, 4, torch.float32, "cpu")
    backend = TorchPagedBackend(pool)
    from minisgl.attention.metadata import BatchMetadata

    n = backend.plan(BatchMetadata.from_requests([[0, 1]], [3], [2], 4))
    before = (n._write_slots.clone(), list(n._seq_lens))
    n1 = backend.plan(BatchMetadata.from_requests([[5], [6, 7]], [0, 4], [1, 1], 4))
    assert n1 is not n and torch.equal(n._write_slots, before[0]) and n._seq_lens == before[1]
    assert n.meta is not n1.meta


@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_arriving_after_its_prefix_launched_waits_for_it_instead_of_recomputing(overlap: bool) -> None:
    """A's 32-token prompt is launched at step 0; B, sharing those 32 tokens, arrives at step 1.
    With the lagged loop A's prefix is still on its way to the radix cache when step 1 is planned
    (A's batch is processed after step 1 is launched): B must wait for it, not compute the same
    prefix again beside it, and then take all 32 tokens from the cache (as it does without
    overlap, where A's prefix is in the tree by then). Tokens still HF's."""
    rng = random.Random("in-flight-prefix")
    prefix = [rng.randrange(8, 512) for _ in range(32)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    jobs = [(0, prefix + [17, 3], params), (1, prefix + [99, 41, 7], params)]
    sched = make_scheduler("qwen3", overlap=overlap, budget=None)
    reqs = run(sched, jobs)
    assert [r.num_cached_tokens for r in reqs] == [0, 32]
    assert sched.kv.stats.hit_tokens == 32
    for (_, prompt, p), req in zip(jobs, reqs):
        assert req.output_ids == expected("qwen3", prompt, p)
