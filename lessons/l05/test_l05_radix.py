"""Lesson 5: the radix cache shares prefixes and every request still gets HF's tokens.

Run: pytest lessons/l05

These tests drive the scheduler with ``prefix_cache=True`` on workloads whose prompts share
prefixes (a system prompt, multi-turn chat, identical prompts, a prompt that is a strict prefix
of another), with page sizes 1, 16 and 3, and pools so small that the tree must evict and
running requests must be retracted. After every step the pages are accounted for: each one is
free, owned by the tree, or owned by exactly one running request. The tree itself has a
property test against a naive model in ``test_l05_tree.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.attention.paged import TorchPagedBackend
from minisgl.core import Req, ReqStatus
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.kvcache.radix_cache import RadixCache
from minisgl.llm import RequestFailedError
from minisgl.scheduler.cache_manager import CacheManager
from minisgl.scheduler.page_table import PageTable
from minisgl.scheduler.scheduler import Scheduler
from minisgl.testing import distinct_fraction, hf_greedy_tokens, tiny_checkpoint, tiny_model
from tests.tools.exercises import code_under_test

NEW_TOKENS = 24


def make_scheduler(arch: str, *, num_pages: int, page_size: int, max_running: int = 16,
                   max_prefill_tokens: int = 512, cls: type[Scheduler] = Scheduler) -> Scheduler:
    model = tiny_model(arch)
    pool = PagedKVPool.for_model(model.config, num_pages, page_size, torch.float32, "cpu")
    config = EngineConfig(max_running=max_running, max_prefill_tokens=max_prefill_tokens, max_seq_len=256,
                          prefix_cache=True, chunked_prefill_size=None, overlap=False)
    return build_scheduler(make_engine(model, TorchPagedBackend(pool), config), config,
                           vocab_size=model.config.vocab_size, cls=cls)


def assert_pages_accounted(sched: Scheduler) -> None:
    """free + tree + running requests' own pages == pool, and no page has two owners."""
    kv = sched.kv
    assert isinstance(kv, CacheManager)
    tree = kv.tree.pages()
    own = [p for r in sched.running for p in kv.own_pages(r)]
    assert len(tree) == len(set(tree)) == kv.tree.total_pages, "the tree owns a page twice"
    assert len(own) == len(set(own)), "a page is owned by two running requests"
    assert not set(own) & set(tree), "a page is owned by a request and by the tree"
    assert kv.allocator.num_free + len(tree) + len(own) == kv.num_pages, "pages leaked or double counted"
    assert kv.allocator.num_allocated == len(tree) + len(own)
    for r in sched.running:  # a row's leading pages are the tree's, locked
        assert set(kv.page_table.pages(r.table_row)[: r.num_tree_pages]) <= set(tree)
    if not sched.running:
        assert kv.tree.protected_pages == 0, "a lock outlived every request (unlock does not mirror lock)"


@dataclass
class Job:
    arrival: int  # scheduler step at which the request is added
    prompt: list[int]
    max_tokens: int = NEW_TOKENS
    req: Req | None = None


def run_jobs(sched: Scheduler, jobs: list[Job], check: bool = True, max_steps: int = 4000) -> None:
    jobs = sorted(jobs, key=lambda j: j.arrival)
    step = nxt = 0
    while nxt < len(jobs) or sched.has_work:
        while nxt < len(jobs) and jobs[nxt].arrival <= step:
            jobs[nxt].req = sched.add_request(jobs[nxt].prompt, SamplingParams(max_tokens=jobs[nxt].max_tokens, ignore_eos=True))
            nxt += 1
        sched.step()
        step += 1
        if check:
            assert_pages_accounted(sched)
        assert step < max_steps, "the scheduler stopped making progress"


def mismatches(arch: str, jobs: list[Job]) -> list[int]:
    return [i for i, j in enumerate(jobs) if tuple(j.req.output_ids) != hf_greedy_tokens(arch, tuple(j.prompt), j.max_tokens)]


def rand_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(8, 512) for _ in range(n)]


def shared_prefix_workload(arch: str) -> list[Job]:
    """One system prompt with many questions, a two-turn chat (turn 2 extends turn 1's prompt
    and answer), identical prompts, and a prompt that is a strict prefix of another."""
    rng = random.Random(f"l05-{arch}")
    system = rand_ids(rng, 35)
    jobs = [Job(i // 3, system + rand_ids(rng, rng.randint(1, 12))) for i in range(9)]
    turn1 = system[:20] + rand_ids(rng, 7)
    answer = list(hf_greedy_tokens(arch, tuple(turn1), NEW_TOKENS))
    jobs.append(Job(0, turn1))
    jobs.append(Job(8, turn1 + answer + rand_ids(rng, 5)))  # turn 2 arrives after turn 1 finished
    jobs += [Job(2, jobs[0].prompt), Job(6, jobs[0].prompt)]  # identical prompts
    long = rand_ids(rng, 30)
    jobs += [Job(1, long), Job(9, long[:17])]  # a strict prefix of an earlier prompt
    return jobs


# --------------------------------------------------------------------------------------------
# Parity on shared-prefix workloads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 16, 3])
@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_shared_prefixes_match_hf_alone(arch: str, page_size: int) -> None:
    jobs = shared_prefix_workload(arch)
    sched = make_scheduler(arch, num_pages=2048 // page_size, page_size=page_size)
    run_jobs(sched, jobs)
    assert mismatches(arch, jobs) == []
    assert all(distinct_fraction(j.req.output_ids) > 0.5 for j in jobs), "degenerate outputs prove nothing"
    stats = sched.kv.stats
    hits = [j.req.num_cached_tokens for j in jobs]
    assert sum(h > 0 for h in hits) >= 6, f"the cache must serve most shared prefixes: {hits}"
    assert all(h % page_size == 0 for h in hits), "hits are whole pages"
    assert all(h < len(j.prompt) for h, j in zip(hits, jobs)), "the last prompt token is always computed"
    assert stats.hit_tokens == sum(hits) and stats.retractions == 0


def test_scripted_hit_counts_are_exactly_as_predicted() -> None:
    """Page size 4. A: 10 prompt tokens, 6 new -> 15 tokens of KV when it finishes -> the tree
    keeps 3 full pages (12 tokens: A's prompt and its first 2 outputs).
    B = A's prompt + 3 other tokens: pages 1-2 match, page 3 differs (A's outputs there) -> 8.
    C = A's prompt + A's outputs + 1 (a second chat turn): 12 (its 17th token is recomputed).
    D = A's prompt again: at most 9 tokens may match (the last is recomputed) -> 8.
    E = A's first 3 tokens: no whole page -> 0. F = B again after B finished: B left 4 pages
    (its 16 cached tokens), of which F may use the first 12 (its 13th is recomputed) -> 12."""
    arch = "llama"
    sched = make_scheduler("llama", num_pages=64, page_size=4)
    rng = random.Random("scripted")
    a = rand_ids(rng, 10)
    out_a = list(hf_greedy_tokens(arch, tuple(a), 6))
    b = a + rand_ids(rng, 3)
    prompts = [(a, 6), (b, 5), (a + out_a + [9], 4), (a, 4), (a[:3], 4), (b, 4)]
    hits = []
    for prompt, n in prompts:  # one at a time: each finishes before the next arrives
        job = Job(0, prompt, n)
        run_jobs(sched, [job])
        assert mismatches(arch, [job]) == []
        hits.append(job.req.num_cached_tokens)
    assert hits == [0, 8, 12, 8, 0, 12]
    assert sched.kv.stats.hit_tokens == 40 and sched.kv.stats.prompt_tokens == 10 + 13 + 17 + 10 + 3 + 13


def test_a_request_waits_one_step_for_a_prefix_computed_in_the_same_batch() -> None:
    """B arrives with A and shares A's 24-token prefix: admitting both at once would compute it
    twice, so B waits one step and then finds it in the tree. Its hit is counted once, exactly."""
    arch = "qwen2"
    rng = random.Random("same-batch")
    prefix = rand_ids(rng, 24)
    jobs = [Job(0, prefix + rand_ids(rng, 2)), Job(0, prefix + rand_ids(rng, 3))]
    sched = make_scheduler(arch, num_pages=64, page_size=4)
    run_jobs(sched, jobs)
    assert mismatches(arch, jobs) == []
    assert [j.req.num_cached_tokens for j in jobs] == [0, 24]
    assert (sched.kv.stats.hit_tokens, sched.kv.stats.prompt_tokens) == (24, 26 + 27)


def test_cache_off_is_lesson_4() -> None:
    llm = LLM(tiny_checkpoint("qwen3"), num_pages=128, page_size=4, max_running=8, max_seq_len=256, prefix_cache=False)
    prompt = rand_ids(random.Random("off"), 30)
    outs = llm.generate([prompt, prompt], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    outs += llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0]
    assert llm.scheduler.kv.allocator.num_free == 128
    on = LLM(tiny_checkpoint("qwen3"), num_pages=128, page_size=4, max_running=8, max_seq_len=256)
    on.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    again = on.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)[0]
    assert again.num_cached_tokens == 28 and again.token_ids == outs[0].token_ids


# --------------------------------------------------------------------------------------------
# Pressure: eviction and retraction
# --------------------------------------------------------------------------------------------


def test_eviction_under_pressure_stays_identical() -> None:
    """A pool barely larger than one request: every admission evicts someone's cached prefix."""
    arch, page_size = "qwen2", 4
    rng = random.Random("evict")
    jobs = [Job(3 * i, rand_ids(rng, rng.randint(20, 40))) for i in range(10)]
    jobs += [Job(40, jobs[0].prompt), Job(41, jobs[0].prompt)]  # evicted long ago; then just cached
    sched = make_scheduler(arch, num_pages=18, page_size=page_size, max_running=1)
    run_jobs(sched, jobs)
    assert mismatches(arch, jobs) == []
    assert sched.kv.stats.evicted_pages > 0
    assert jobs[-2].req.num_cached_tokens == 0, "the oldest prefix was evicted"
    assert jobs[-1].req.num_cached_tokens > 0, "the prefix of the request that just finished survives"


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_retraction_keeps_greedy_and_seeded_outputs_identical(arch: str) -> None:
    """A pool too small for every running request to finish: decode runs dry, the requests with
    the least progress are retracted and later re-admitted from the cache. Greedy outputs equal
    HF; seeded ones equal a run in a pool big enough never to retract."""
    rng = random.Random(f"retract-{arch}")
    prompts = [rand_ids(rng, rng.randint(8, 20)) for _ in range(8)]
    n = 40
    params = [SamplingParams(max_tokens=n, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=n, ignore_eos=True)
              for i in range(len(prompts))]

    def run(num_pages: int) -> tuple[list[list[int]], Scheduler]:
        sched = make_scheduler(arch, num_pages=num_pages, page_size=4)
        reqs = [sched.add_request(p, sp) for p, sp in zip(prompts, params)]
        for _ in range(3000):
            if not sched.has_work:
                break
            sched.step()
            assert_pages_accounted(sched)
        return [r.output_ids for r in reqs], sched

    roomy, roomy_sched = run(512)
    tight, tight_sched = run(20)  # 80 tokens of KV; one request needs at most 60
    assert roomy_sched.kv.stats.retractions == 0
    assert tight_sched.kv.stats.retractions >= 3, "the pool must really have run dry"
    assert tight == roomy
    for i in range(1, len(prompts), 2):
        assert tuple(tight[i]) == hf_greedy_tokens(arch, tuple(prompts[i]), n)


def test_a_request_that_fits_the_empty_pool_always_runs() -> None:
    """Deadlock freedom: requests each needing most of the pool, arriving together."""
    arch = "qwen3"
    rng = random.Random("fits")
    jobs = [Job(0, rand_ids(rng, 30), 30) for _ in range(5)]  # 60 tokens each = 15 pages of 4
    sched = make_scheduler(arch, num_pages=16, page_size=4)
    run_jobs(sched, jobs)
    assert mismatches(arch, jobs) == []


# --------------------------------------------------------------------------------------------
# Aborts and errors unlock what they locked
# --------------------------------------------------------------------------------------------


def test_abort_and_error_unlock_their_prefix(monkeypatch) -> None:
    llm = LLM(tiny_checkpoint("qwen3"), num_pages=64, page_size=4, max_running=8, max_seq_len=128,
              overlap=False)  # steps driven by hand: lesson 5's synchronous loop
    sched = llm.scheduler
    rng = random.Random("unlock")
    system = rand_ids(rng, 24)
    warm = llm.generate([system + [9]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)[0]
    assert warm.num_cached_tokens == 0 and sched.kv.tree.total_pages > 0

    a = sched.add_request(system + [10, 11], SamplingParams(max_tokens=20, ignore_eos=True))
    b = sched.add_request(system + [12], SamplingParams(max_tokens=20, ignore_eos=True))
    for _ in range(3):
        sched.step()
    assert a.num_cached_tokens == 24 and b.num_cached_tokens == 24 and sched.kv.tree.protected_pages > 0
    sched.abort(a)
    sched.abort(a)  # twice: harmless
    assert_pages_accounted(sched)
    forward = llm.engine.forward
    monkeypatch.setattr(llm.engine, "forward", lambda batch: (_ for _ in ()).throw(RuntimeError("injected")))
    assert sched.step() == [b] and b.finish_reason == "error"
    monkeypatch.setattr(llm.engine, "forward", forward)
    assert_pages_accounted(sched)
    assert sched.kv.tree.protected_pages == 0

    # A failure through LLM.generate with the cache on: the same clean state, then correct output.
    monkeypatch.setattr(llm.engine, "forward", lambda batch: (_ for _ in ()).throw(RuntimeError("injected")))
    with pytest.raises(RequestFailedError, match="injected"):
        llm.generate([system + [13]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    monkeypatch.setattr(llm.engine, "forward", forward)
    assert_pages_accounted(sched)
    out = llm.generate([system + [13]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)[0]
    assert out.num_cached_tokens == 24 and tuple(out.token_ids) == hf_greedy_tokens("qwen3", tuple(system + [13]), 8)
    assert all(r.status == ReqStatus.FINISHED for r in (a, b))


# --------------------------------------------------------------------------------------------
# Teeth: the anchors' radix-cache bugs, injected one at a time, must each be caught
# --------------------------------------------------------------------------------------------


class FullHitManager(CacheManager):
    """Bug: a prompt whose every token is cached matches in full, leaving zero tokens to compute."""

    MIN_UNCACHED = 0


class StaleNodeTree(RadixCache):
    """Bug: eviction returns a node's pages to the allocator but leaves the node in the tree, so a
    later match hands out pages that now belong to someone else."""

    def evict(self, num_pages):
        links = [(node, node.parent) for node in self.nodes() if node.parent is not None]
        freed = super().evict(num_pages)
        for node, parent in links:
            if node.evicted:  # re-link it: a stale node
                node.evicted, node.parent = False, parent
                parent.children[node.key[: self.page_size]] = node
        return freed


class UnlockParentTree(RadixCache):
    """Bug: unlock starts one node too high, so it does not mirror lock: the node itself keeps
    its reference and its pages can never be evicted again."""

    def unlock(self, node):
        super().unlock(node.parent if node.parent is not None else node)


class KeepDuplicatesPageTable(PageTable):
    """Bug: when the tree already has a request's prefix, the request's duplicate pages are freed
    but its row is not re-pointed at the tree's pages: it keeps reading freed pages."""

    def replace_pages(self, row, pages):
        pass


def inject(sched: Scheduler, bug: str) -> None:
    kv = sched.kv
    if bug == "full prefix hit computes zero tokens":
        kv.__class__ = FullHitManager
    elif bug == "stale node returns evicted pages":
        kv.tree.__class__ = StaleNodeTree
    elif bug == "unlock does not mirror lock":
        kv.tree.__class__ = UnlockParentTree
    elif bug == "duplicate prefix page freed while referenced":
        kv.page_table.__class__ = KeepDuplicatesPageTable
    else:
        raise ValueError(bug)


def teeth_workload(arch: str) -> list[Job]:
    """Identical page-aligned prompts in one batch (duplicates), waves of other prompts in a small
    pool (eviction), and the first prompt again after it was evicted and while it is cached."""
    rng = random.Random(f"l05-teeth-{arch}")
    a = rand_ids(rng, 16)
    jobs = [Job(0, a), Job(0, a), Job(0, a + rand_ids(rng, 4))]
    jobs += [Job(2 + 2 * i, rand_ids(rng, rng.randint(10, 24))) for i in range(8)]
    jobs += [Job(30, a), Job(31, a + rand_ids(rng, 2)), Job(60, a)]
    return jobs


BUGS = ["full prefix hit computes zero tokens", "stale node returns evicted pages",
        "unlock does not mirror lock", "duplicate prefix page freed while referenced"]


@pytest.mark.parametrize("bug", BUGS)
def test_radix_bugs_are_caught(bug: str) -> None:
    arch = "llama"
    control = make_scheduler(arch, num_pages=40, page_size=4, max_running=4)
    jobs = teeth_workload(arch)
    run_jobs(control, jobs)
    assert mismatches(arch, jobs) == [], (
        f"control run on {code_under_test(5)}: the workload must pass before an injected bug can prove anything")
    assert control.kv.stats.evicted_pages > 0 and sum(j.req.num_cached_tokens == 16 for j in jobs) >= 1

    # 1. the accounting checked after every step, and the final parity check
    buggy = make_scheduler(arch, num_pages=40, page_size=4, max_running=4)
    inject(buggy, bug)
    jobs = teeth_workload(arch)
    with pytest.raises(Exception) as caught:
        run_jobs(buggy, jobs)
        assert not mismatches(arch, jobs), "outputs differ from HF"
    print(f"{bug}: {type(caught.value).__name__}: {str(caught.value).splitlines()[0]}")

    # 2. the parity check alone (no accounting) catches the bugs that corrupt KV
    if bug != "unlock does not mirror lock":  # that one leaks pages but computes correctly
        buggy = make_scheduler(arch, num_pages=40, page_size=4, max_running=4)
        inject(buggy, bug)
        jobs = teeth_workload(arch)
        try:
            run_jobs(buggy, jobs, check=False)
        except Exception:
            return  # it crashed outright: caught
        assert mismatches(arch, jobs), f"{bug}: the parity check alone must notice"
