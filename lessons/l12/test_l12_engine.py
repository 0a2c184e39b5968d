"""Lesson 12: speculative decoding through the engine gives exactly the target's greedy tokens.

Run: pytest lessons/l12

The n-gram proposer guesses from a request's own earlier tokens; one verify forward per step
checks the guesses; the greedy acceptance rule keeps only what the target would have produced.
So every request must get Hugging Face's tokens exactly, alone or batched, with lesson 4's KV
manager or lesson 5's radix cache, with lesson 6's chunked prefill, under retraction and over
two tensor-parallel ranks. After every step the pages are accounted for, and a decoding
request owns no page past its verified tokens (rejected drafts' pages went back at once).

The test models: the tiny checkpoints of the other lessons, but drawn with a smaller weight
std (0.12 instead of 0.3). Their greedy text still varies, but now and then repeats itself,
which is what prompt lookup feeds on; at 0.3 almost no draft is ever accepted and a parity
test would prove little. Every test that checks parity also checks that drafts were accepted,
several tokens at a time in some steps, and that each step added its accepted tokens plus one.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.attention.paged import TorchPagedBackend
from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine import verify as verify_module
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.models import load_model
from minisgl.scheduler import speculative as speculative_module
from minisgl.scheduler.cache_manager import CacheManager
from minisgl.scheduler.draft import DraftModelProposer
from minisgl.scheduler.kv_manager import KVManager
from minisgl.scheduler.scheduler import Scheduler, SyncLoop
from minisgl.scheduler.speculative import SpeculativeLoop
from minisgl.testing import HFReference, distinct_fraction, draft_checkpoint, tiny_checkpoint

SPEC_STD = 0.12
NEW_TOKENS = 40


def spec_checkpoint(arch: str):
    return tiny_checkpoint(arch, std=SPEC_STD)


@functools.cache
def spec_model(arch: str):
    return load_model(spec_checkpoint(arch), dtype=torch.float32)


@functools.cache
def hf_tokens(arch: str, prompt: tuple[int, ...], n: int, stop: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """HF's greedy tokens for ``prompt`` alone (``stop``: stop token ids, the stop included)."""
    return tuple(HFReference(spec_checkpoint(arch)).greedy(list(prompt), n, stop_token_ids=stop))


class RecordingScheduler(Scheduler):
    """The real scheduler; it writes down each batch: its mode, and per row the extend length,
    whether it samples and its number of drafts."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[tuple[str, list[int], list[bool], list[int]]] = []

    def schedule(self) -> Batch | None:
        batch = super().schedule()
        if batch is not None:
            drafts = [len(d) for d in batch.drafts] if batch.drafts is not None else [0] * batch.size
            self.trace.append((batch.mode, list(batch.extend_lens), list(batch.samples), drafts))
        return batch

    @property
    def verify_batches(self) -> list[tuple[str, list[int], list[bool], list[int]]]:
        return [t for t in self.trace if t[0] == "verify"]


def make_scheduler(arch: str, *, k: int = 4, prefix_cache: bool = True, chunked: int | None = None,
                   num_pages: int = 512, page_size: int = 4, max_running: int = 16, draft: Path | None = None,
                   draft_pages: int = 512) -> RecordingScheduler:
    """The speculative scheduler over the tiny ``arch`` model: the n-gram proposer, or with
    ``draft`` (a checkpoint) the draft-model proposer over its own pool of ``draft_pages``."""
    model = spec_model(arch)
    pool = PagedKVPool.for_model(model.config, num_pages, page_size, torch.float32, "cpu")
    config = EngineConfig(max_running=max_running, max_prefill_tokens=512, max_seq_len=256, prefix_cache=prefix_cache,
                          chunked_prefill_size=chunked, overlap=False, speculative="draft" if draft else "ngram",
                          num_speculative_tokens=k, draft_model=str(draft) if draft else None)
    proposer = None
    if draft is not None:
        draft_model = load_model(draft, dtype=torch.float32)
        draft_pool = PagedKVPool.for_model(draft_model.config, draft_pages, page_size, torch.float32, "cpu")
        proposer = DraftModelProposer(Engine(draft_model, TorchPagedBackend(draft_pool)), max_running, 256)
    sched = build_scheduler(make_engine(model, TorchPagedBackend(pool), config), config,
                            vocab_size=model.config.vocab_size, cls=RecordingScheduler, proposer=proposer)
    assert isinstance(sched.loop, SpeculativeLoop)
    return sched


def assert_pages_accounted(sched: Scheduler) -> None:
    """Every page is free, the tree's, or one running request's; and a decoding request owns
    exactly the pages its verified KV needs (lesson 5: none left over from rejected drafts) or,
    with lesson 4's manager, its whole life's reservation."""
    kv = sched.kv
    if isinstance(kv, KVManager):
        rows = [kv.page_table.pages(r.table_row) for r in sched.running]
        assert all(len(p) == kv.pages_needed(r.length_limit) for p, r in zip(rows, sched.running))
        owned = [p for pages in rows for p in pages]
        tree: list[int] = []
    else:
        assert isinstance(kv, CacheManager)
        tree = kv.tree.pages()
        owned = [p for r in sched.running for p in kv.own_pages(r)]
        for r in sched.running:
            if r.decoding:
                assert kv.page_table.pages_in_row(r.table_row) == kv.pages_needed(r.num_cached), (
                    f"r{r.rid} owns {kv.page_table.pages_in_row(r.table_row)} pages for {r.num_cached} verified tokens")
    assert len(owned) == len(set(owned)) and not set(owned) & set(tree), "a page has two owners"
    assert kv.allocator.num_free + len(tree) + len(owned) == kv.num_pages, "pages leaked or double counted"
    for r in sched.running:
        assert r.num_cached < r.seq_len, "KV counted for a token that is not in the sequence"


@dataclass
class Job:
    arrival: int
    prompt: list[int]
    max_tokens: int = NEW_TOKENS
    stop: tuple[int, ...] | None = None
    req: Req | None = None


def run_jobs(sched: Scheduler, jobs: list[Job], max_steps: int = 3000) -> None:
    jobs = sorted(jobs, key=lambda j: j.arrival)
    step = nxt = 0
    while nxt < len(jobs) or sched.has_work:
        while nxt < len(jobs) and jobs[nxt].arrival <= step:
            job = jobs[nxt]
            params = SamplingParams(max_tokens=job.max_tokens, ignore_eos=True, stop_token_ids=list(job.stop or ()))
            job.req = sched.add_request(job.prompt, params)
            nxt += 1
        sched.step()
        step += 1
        assert_pages_accounted(sched)
        if isinstance(sched.loop.proposer, DraftModelProposer):
            sched.loop.proposer.check_pages()
        assert step < max_steps, "the scheduler stopped making progress"


def workload(arch: str, n: int = 8, seed: str = "") -> list[Job]:
    """Half the prompts repeat a short pattern a few times, half are random; arrivals spread."""
    rng = random.Random(f"l12-{arch}{seed}")
    jobs = []
    for i in range(n):
        if i % 2 == 0:
            pattern = [rng.randrange(8, 512) for _ in range(rng.randint(2, 6))]
            prompt = pattern * rng.randint(2, 5)
        else:
            prompt = [rng.randrange(8, 512) for _ in range(rng.randint(5, 30))]
        jobs.append(Job(i, prompt))
    return jobs


def check_outputs(arch: str, jobs: list[Job]) -> None:
    """Each request has HF's tokens; each step that gave it tokens added its accepted drafts plus
    one token (the bonus included), up to a stop token."""
    for i, job in enumerate(jobs):
        req = job.req
        assert req.status == ReqStatus.FINISHED and req.finish_reason in ("length", "stop"), (i, req.finish_reason)
        assert tuple(req.output_ids) == hf_tokens(arch, tuple(job.prompt), job.max_tokens, job.stop), f"request {i}"
        assert len(req.spec_drafted) == len(req.spec_accepted)
        assert all(0 <= a <= d for d, a in zip(req.spec_drafted, req.spec_accepted))
        added = sum(a + 1 for a in req.spec_accepted)
        if req.finish_reason == "length":
            assert len(req.output_ids) == added, f"request {i}: a step did not add its accepted tokens + 1"
        else:
            assert added - req.spec_accepted[-1] <= len(req.output_ids) <= added


def acceptance(jobs: list[Job]) -> tuple[int, int]:
    """(accepted draft tokens, steps that accepted two or more) over the jobs."""
    accepted = [a for j in jobs for a in j.req.spec_accepted]
    return sum(accepted), sum(a >= 2 for a in accepted)


# --------------------------------------------------------------------------------------------
# Parity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_alone_and_batched_match_hf(arch: str) -> None:
    jobs = workload(arch)
    alone = [Job(0, job.prompt) for job in jobs]
    for job in alone:  # alone: one request in the engine at a time
        run_jobs(make_scheduler(arch), [job])
    check_outputs(arch, alone)
    sched = make_scheduler(arch)
    run_jobs(sched, jobs)  # batched: arriving one step apart, joining and leaving mid-flight
    check_outputs(arch, jobs)
    accepted, multi = acceptance(jobs)
    assert accepted >= 10 and multi >= 1, f"drafts must be accepted, several at once in some steps: {accepted}, {multi}"
    assert sum(distinct_fraction(j.req.output_ids) > 0.4 for j in jobs) >= len(jobs) // 2, "degenerate outputs"
    verify = sched.verify_batches
    assert any(0 in drafts and any(drafts) for _, _, _, drafts in verify), \
        "a verify batch must mix rows with and without drafts"
    stats = sched.loop.acceptance
    assert stats.accepted == accepted and stats.steps == sum(d > 0 for j in jobs for d in j.req.spec_drafted)
    assert all(j.req.spec_drafted[0] == 0 for j in jobs), "the prefill's step proposes nothing"


def test_lesson4_kv_manager_only_moves_the_counts() -> None:
    """Whole prompts and no prefix cache: every request reserved its whole life at admission,
    so drafts always fit and rejected ones give back nothing but ``num_cached``."""
    arch = "llama"
    jobs = workload(arch, seed="kv")
    sched = make_scheduler(arch, prefix_cache=False, num_pages=256)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    assert acceptance(jobs)[0] > 0
    assert sched.kv.allocator.num_free == sched.kv.num_pages


@pytest.mark.parametrize("budget", [1, 12])
def test_chunked_prefill_and_verify_rows_share_batches(budget: int) -> None:
    """A prompt being chunked does not speculate (its rows sample nothing until its last
    chunk); decoding requests verify drafts in the same batches."""
    arch = "qwen2"
    jobs = workload(arch, seed="chunked")
    sched = make_scheduler(arch, chunked=budget)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    assert acceptance(jobs)[0] > 0
    mixed = [t for t in sched.verify_batches if not all(t[2])]  # a chunk that samples nothing rides along
    if budget > len(jobs):  # (a budget of 1 is spent on the decode rows whenever there are any)
        assert mixed, "chunks of prompts and verify rows must share a batch"
    for _, _, samples, drafts in sched.trace:
        assert all(d == 0 for d, s in zip(drafts, samples) if not s), "a non-final chunk got drafts"


def tree_sequences(tree) -> list[list[int]]:
    """The token sequence of every path from the root to a leaf of the radix tree."""
    out = []
    stack = [(child, list(child.key)) for child in tree.root.children.values()]
    while stack:
        node, tokens = stack.pop()
        if node.is_leaf:
            out.append(tokens)
        stack += [(c, tokens + list(c.key)) for c in node.children.values()]
    return out


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_cache_holds_only_verified_tokens(page_size: int) -> None:
    """Shared prefixes and second turns (a first turn's prompt and answer, then more) hit the
    cache and still get HF's tokens; every sequence in the tree is a prefix of some request's
    verified sequence (prompt + output), never a rejected draft."""
    arch = "qwen3"
    rng = random.Random("l12-radix")
    first = workload(arch, n=6, seed="radix")
    system = first[0].prompt
    jobs = first + [Job(8 + i, system + [rng.randrange(8, 512) for _ in range(3)]) for i in range(3)]
    sched = make_scheduler(arch, page_size=page_size, num_pages=2048 // page_size)
    run_jobs(sched, jobs)
    turn2 = [Job(0, j.prompt + list(j.req.output_ids) + [rng.randrange(8, 512) for _ in range(2)]) for j in first[:4]]
    run_jobs(sched, turn2)
    everything = jobs + turn2
    check_outputs(arch, everything)
    assert all(j.req.num_cached_tokens >= (len(j.prompt) - 3) // page_size * page_size - page_size for j in turn2)
    assert acceptance(everything)[0] > 0
    verified = [j.prompt + list(j.req.output_ids) for j in everything]
    for seq in tree_sequences(sched.kv.tree):
        assert any(v[:len(seq)] == seq for v in verified), "the tree holds a token no request verified"


def test_retraction_under_a_tight_pool_stays_identical() -> None:
    """A pool so small that decode runs dry and requests are retracted (their verified KV into
    the tree); drafts only ever take free pages."""
    arch = "llama"
    jobs = [Job(0, j.prompt, 30) for j in workload(arch, seed="tight")]
    sched = make_scheduler(arch, num_pages=24, page_size=4)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    assert sched.kv.stats.retractions >= 1, "the pool must really have run dry"
    assert acceptance(jobs)[0] > 0


# --------------------------------------------------------------------------------------------
# Where a request must stop, and per-request k
# --------------------------------------------------------------------------------------------


class OracleProposer:
    """Proposes the reference's own next tokens (a test double): every draft is accepted, so
    every verify step adds ``k + 1`` tokens, and the test decides where a run begins and ends."""

    def __init__(self, reference: dict[tuple[int, ...], tuple[int, ...]]) -> None:
        self.reference = reference

    def propose(self, reqs, limits) -> list[list[int]]:
        return [list(self.reference[tuple(r.prompt_ids)][len(r.output_ids):len(r.output_ids) + n])
                for r, n in zip(reqs, limits)]

    def release(self, req) -> None:
        pass


@pytest.mark.parametrize("where", [2, 4, 5])
def test_a_stop_token_inside_an_accepted_run_cuts_the_output_there(where: int) -> None:
    """With every draft right (k = 4), token 0 comes from the prefill and tokens 1-5 from the
    first verify step (four drafts and the bonus). Make token ``where`` (a draft inside the run,
    the last draft, the bonus) a stop token: the output ends right there, as one-token-at-a-time
    decoding ends it, and the KV of the tokens after it is given back."""
    arch = "llama"
    prompts = [j.prompt for j in workload(arch, seed="stop")]
    reference = {tuple(p): hf_tokens(arch, tuple(p), NEW_TOKENS) for p in prompts}
    jobs = [Job(0, p, NEW_TOKENS, (reference[tuple(p)][where],)) for p in prompts
            if reference[tuple(p)][where] not in reference[tuple(p)][:where]]  # (else it stops earlier)
    assert len(jobs) >= 3
    sched = make_scheduler(arch, k=4)
    sched.loop.proposer = OracleProposer(reference)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    for job in jobs:
        assert job.req.finish_reason == "stop" and len(job.req.output_ids) == where + 1
        assert job.req.spec_accepted == [0, 4]
    assert sched.kv.allocator.num_free + sched.kv.tree.total_pages == sched.kv.num_pages


def test_a_stop_string_inside_an_accepted_run_ends_the_output_there() -> None:
    """The offline ``LLM`` watches stop strings in the text: when a step adds several tokens, it
    reads them one by one, and the output (tokens, text, finish reason) ends at the token that
    completed the stop string, as without speculation."""
    arch = "llama"
    settings = dict(max_seq_len=128, num_pages=256, page_size=4)
    spec = LLM(spec_checkpoint(arch), speculative="ngram", num_speculative_tokens=4, **settings)
    plain = LLM(spec_checkpoint(arch), **settings)
    tok = spec.tokenizer
    cases = []
    for job in workload(arch, seed="stop"):
        ref = hf_tokens(arch, tuple(job.prompt), NEW_TOKENS)
        for where in (2, 3):  # inside the first verify step's run (tokens 1-5, every draft right)
            text = tok.decode(list(ref[where:where + 1]))
            before = tok.decode(list(ref[:where]))
            if text.strip() and text.isprintable() and text not in tok.decode(list(ref[:where + 1]))[:len(before)]:
                cases.append((job.prompt, ref, text))
                break
    assert len(cases) >= 2
    spec.scheduler.loop.proposer = OracleProposer({tuple(p): ref for p, ref, _ in cases})
    for prompt, _, stop in cases:
        params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, stop=[stop], logprobs=0)
        (a,), (b,) = spec.generate([prompt], params, progress=False), plain.generate([prompt], params, progress=False)
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert a.finish_reason == "stop" and len(a.token_ids) < 6 and len(a.logprobs) == len(a.token_ids)
        assert a.spec_accepted == [0, 4], "the stop string came inside a step that accepted every draft"
    kv = spec.scheduler.kv
    assert kv.allocator.num_free + kv.tree.total_pages == kv.num_pages


def test_max_tokens_limits_each_requests_drafts() -> None:
    """k' = min(k, max_tokens left - 1): a fully accepted step (drafts + bonus) never passes
    ``max_tokens``; a request with one token left decodes plainly. The same prompts with
    different ``max_tokens`` speculate differently in one batch."""
    arch = "qwen3"
    base = workload(arch)
    jobs = [Job(0, base[i % 4 * 2].prompt, n) for i, n in enumerate([1, 2, 3, 5, 9, 17, 24, 33])]
    sched = make_scheduler(arch, k=6)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    for job in jobs:
        req, made = job.req, 0
        for drafted, accepted in zip(req.spec_drafted, req.spec_accepted):
            assert drafted <= min(6, job.max_tokens - made - 1)
            made += accepted + 1
        assert len(req.output_ids) == job.max_tokens
    assert sched.loop.draft_limit(jobs[-1].req) == 0  # finished: nothing left to propose



# --------------------------------------------------------------------------------------------
# The offline API, logprobs, faults, tensor parallelism
# --------------------------------------------------------------------------------------------


def test_llm_reports_accepted_tokens_per_step_and_logprobs_are_unchanged() -> None:
    arch = "llama"
    prompts = [j.prompt for j in workload(arch)[:4]]
    params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2)
    spec = LLM(spec_checkpoint(arch), speculative="ngram", num_speculative_tokens=3, max_seq_len=128, num_pages=256,
               page_size=4)
    plain = LLM(spec_checkpoint(arch), max_seq_len=128, num_pages=256, page_size=4)
    assert isinstance(spec.scheduler.loop, SpeculativeLoop) and not isinstance(plain.scheduler.loop, SpeculativeLoop)
    assert (spec.engine_config.overlap, plain.engine_config.overlap) == (False, True)
    a = spec.generate(prompts, params, progress=False)
    b = plain.generate(prompts, params, progress=False)
    for x, y, p in zip(a, b, prompts):
        assert x.token_ids == y.token_ids == list(hf_tokens(arch, tuple(p), 24))
        assert len(x.spec_drafted) == len(x.spec_accepted) == len(x.token_ids) - sum(x.spec_accepted)
        assert x.spec_drafted[0] == 0  # the prefill's token
        assert y.spec_drafted is None and y.spec_accepted is None
        assert len(x.logprobs) == len(x.token_ids)
        for u, v in zip(x.logprobs, y.logprobs):
            assert u.logprob == pytest.approx(v.logprob, abs=1e-4)
            assert [t for t, _ in u.top] == [t for t, _ in v.top]
    assert sum(sum(o.spec_accepted) for o in a) > 0
    kv = spec.scheduler.kv
    assert kv.allocator.num_free + kv.tree.total_pages == kv.num_pages


def test_a_failing_verify_step_fails_its_requests_alone(monkeypatch) -> None:
    """An error in a verify forward finishes that batch's requests with an error and frees
    their KV (drafts' pages included); the next requests get HF's tokens."""
    arch = "qwen3"
    sched = make_scheduler(arch)
    real = sched.engine.forward

    def forward(batch: Batch):
        if batch.mode == "verify":
            raise RuntimeError("injected verify failure")
        return real(batch)

    monkeypatch.setattr(sched.engine, "forward", forward)
    victims = workload(arch)[:4]
    run_jobs(sched, victims)
    assert any(j.req.finish_reason == "error" and "injected" in j.req.error for j in victims)
    monkeypatch.setattr(sched.engine, "forward", real)
    again = [Job(0, j.prompt) for j in victims]
    run_jobs(sched, again)
    check_outputs(arch, again)


def test_tp2_matches_hf() -> None:
    """Two tensor-parallel ranks (gloo) each run the speculative loop in lock step: the same
    drafts, the same greedy verdicts, HF's tokens."""
    arch = "qwen2"
    jobs = workload(arch, n=6)
    with LLM(spec_checkpoint(arch), tp_size=2, speculative="ngram", num_speculative_tokens=4, max_running=8,
             max_seq_len=128, chunked_prefill_size=16, page_size=4) as llm:
        outs = llm.generate([j.prompt for j in jobs], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True),
                            progress=False)
    for job, out in zip(jobs, outs):
        assert tuple(out.token_ids) == hf_tokens(arch, tuple(job.prompt), NEW_TOKENS)
        assert len(out.token_ids) == sum(a + 1 for a in out.spec_accepted)
    assert sum(sum(o.spec_accepted) for o in outs) > 0


# --------------------------------------------------------------------------------------------
# The draft-model proposer
# --------------------------------------------------------------------------------------------


def noisy_draft(arch: str) -> Path:
    """The test draft: the target with a little noise on every weight (``draft_checkpoint``)."""
    return draft_checkpoint(spec_checkpoint(arch))


def step_verdicts(jobs: list[Job]) -> list[tuple[int, int]]:
    """(drafted, accepted) of every verify row of the jobs."""
    return [(d, a) for j in jobs for d, a in zip(j.req.spec_drafted, j.req.spec_accepted) if d]


@pytest.mark.parametrize("arch,prefix_cache,chunked", [("qwen3", True, None), ("llama", False, None),
                                                       ("qwen2", True, 8)])
def test_draft_model_alone_and_batched_match_hf(arch: str, prefix_cache: bool, chunked: int | None) -> None:
    """The draft model's guesses, verified: HF's tokens alone and batched, with lesson 4's KV
    manager or lesson 5's radix cache, with lesson 6's chunks; some steps accept every draft,
    some a few, some none; the draft's pool is whole again when the requests are done."""
    jobs = workload(arch, seed="draft")
    alone = [Job(0, job.prompt) for job in jobs[:2]]
    for job in alone:
        run_jobs(make_scheduler(arch, draft=noisy_draft(arch), prefix_cache=prefix_cache, chunked=chunked), [job])
    check_outputs(arch, alone)
    sched = make_scheduler(arch, draft=noisy_draft(arch), prefix_cache=prefix_cache, chunked=chunked)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    verdicts = step_verdicts(jobs)
    assert any(a == d for d, a in verdicts) and any(0 < a < d for d, a in verdicts) and any(a == 0 for d, a in verdicts)
    proposer = sched.loop.proposer
    assert not proposer.rows and proposer.kv.allocator.num_free == proposer.kv.num_pages, "draft KV leaked"


class RecordingDraft(DraftModelProposer):
    """The real draft proposer; it writes down each request's tokens and the drafts it got, and
    any error it raised (the loop would swallow it: that step goes without drafts)."""

    def __init__(self, proposer: DraftModelProposer) -> None:
        self.__dict__.update(proposer.__dict__)
        self.calls: list[tuple[list[int], list[int]]] = []
        self.errors: list[Exception] = []

    def propose(self, reqs, limits):
        try:
            drafts = super().propose(reqs, limits)
        except Exception as exc:
            self.errors.append(exc)
            raise
        self.calls += [(list(r.all_ids), d) for r, d in zip(reqs, drafts) if d]
        return drafts


def draft_run(arch: str = "llama") -> RecordingDraft:
    sched = make_scheduler(arch, draft=noisy_draft(arch))
    sched.loop.proposer = recorder = RecordingDraft(sched.loop.proposer)
    jobs = workload(arch, n=6, seed="draft-own")
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    return recorder


def check_drafts_are_the_draft_models_own(recorder: RecordingDraft, arch: str = "llama") -> None:
    assert not recorder.errors, f"the proposer failed: {recorder.errors[0]!r}"
    assert len(recorder.calls) > 20
    draft = HFReference(noisy_draft(arch))
    for tokens, drafts in recorder.calls:
        assert draft.greedy(tokens, len(drafts)) == drafts, "a draft is not the draft model's greedy token"


def test_drafts_are_the_draft_models_own_greedy_tokens() -> None:
    """Whatever was accepted or rejected before, each step's drafts are exactly what the draft
    model alone (HF, from scratch) continues the request's tokens with: its KV caught up with
    the accepted tokens and dropped the rejected ones."""
    check_drafts_are_the_draft_models_own(draft_run())


def test_teeth_a_draft_that_keeps_rejected_kv_is_caught(monkeypatch) -> None:
    """Keeping the rejected drafts' KV in the draft (no rollback) cannot change the output (the
    target verifies), only the guesses: the test above must catch it, not the parity check.
    (Here a row can even be ahead of its request, and the proposer fails those steps.)"""
    monkeypatch.setattr(DraftModelProposer, "rollback", lambda self, state, tokens: None)
    recorder = draft_run()
    with pytest.raises(AssertionError, match="proposer failed|greedy token"):
        check_drafts_are_the_draft_models_own(recorder)


def test_a_short_draft_pool_gives_fewer_drafts_never_an_error() -> None:
    """A draft pool of 12 pages for 8 requests: rows of requests not decoding are evicted, the
    others get fewer drafts or none; tokens stay HF's and the pool stays whole."""
    arch = "llama"
    jobs = workload(arch, seed="draft-short")
    sched = make_scheduler(arch, draft=noisy_draft(arch), draft_pages=12)
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    assert step_verdicts(jobs), "no request speculated at all"
    assert any(d < 4 for j in jobs for d in j.req.spec_drafted[1:-1] if j.req.params.max_tokens), \
        "the short pool never cut a request's drafts"
    assert sched.loop.proposer.kv.allocator.num_free == 12


def test_a_failing_draft_forward_costs_only_its_drafts(monkeypatch) -> None:
    """The draft model's forward raises in one step: that step verifies no drafts and the rows of
    its requests are dropped (the next step rebuilds them); no request fails."""
    arch = "qwen3"
    sched = make_scheduler(arch, draft=noisy_draft(arch))
    engine = sched.loop.proposer.engine
    real, calls = engine.forward, []

    def forward(batch):
        calls.append(batch)
        if len(calls) == 6:
            raise RuntimeError("injected draft failure")
        return real(batch)

    monkeypatch.setattr(engine, "forward", forward)
    jobs = workload(arch, n=4, seed="draft-fail")
    run_jobs(sched, jobs)
    check_outputs(arch, jobs)
    assert len(calls) > 6 and step_verdicts(jobs)
    assert sched.loop.proposer.kv.allocator.num_free == sched.loop.proposer.kv.num_pages


def test_llm_draft_model_settings_and_tp2() -> None:
    """``LLM(..., speculative="draft", draft_model=...)``: HF's tokens over two tensor-parallel
    ranks (each runs the whole draft); a draft without ``speculative="draft"``, or with another
    vocabulary, is refused with the setting named."""
    arch = "qwen2"
    with pytest.raises(ValueError, match="needs draft_model"):
        EngineConfig(speculative="draft")
    with pytest.raises(ValueError, match="only with speculative='draft'"):
        EngineConfig(speculative="ngram", draft_model="demo-draft")
    with pytest.raises(ValueError, match="vocabulary of 256 tokens"):
        LLM(spec_checkpoint(arch), speculative="draft", draft_model=tiny_checkpoint(arch, vocab_size=256))
    jobs = workload(arch, n=4, seed="draft-tp")
    with LLM(spec_checkpoint(arch), tp_size=2, speculative="draft", draft_model=noisy_draft(arch), max_running=8,
             max_seq_len=128, chunked_prefill_size=16, page_size=4) as llm:
        outs = llm.generate([j.prompt for j in jobs], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True),
                            progress=False)
    for job, out in zip(jobs, outs):
        assert tuple(out.token_ids) == hf_tokens(arch, tuple(job.prompt), NEW_TOKENS)
        assert len(out.token_ids) == sum(a + 1 for a in out.spec_accepted)
    assert sum(sum(o.spec_accepted) for o in outs) > 0


# --------------------------------------------------------------------------------------------
# Teeth: the classic bugs, each caught
# --------------------------------------------------------------------------------------------


def teeth_run(arch: str = "llama") -> list[Job]:
    jobs = workload(arch, seed="teeth")
    run_jobs(make_scheduler(arch), jobs)
    return jobs


def test_teeth_accepting_one_token_too_many_is_caught(monkeypatch) -> None:
    """Accepting the first draft the target disagrees with as well (an off-by-one in the
    prefix match) emits a token the target did not choose."""
    real = verify_module.accept_greedy
    monkeypatch.setattr(verify_module, "accept_greedy", lambda drafts, targets: min(real(drafts, targets) + 1, len(drafts)))
    with pytest.raises(AssertionError, match="request"):
        check_outputs("llama", teeth_run())


def test_teeth_forgetting_the_bonus_token_is_caught(monkeypatch) -> None:
    """When every draft is accepted, the target's token after the last one is free; dropping
    it keeps the tokens right but wastes the step: each step must add accepted + 1 tokens."""
    def no_bonus(drafts, targets):
        accepted = verify_module.accept_greedy(drafts, targets)
        return list(drafts[:accepted]) + ([targets[accepted]] if accepted < len(drafts) else [])

    monkeypatch.setattr(verify_module, "greedy_tokens", no_bonus)
    jobs = teeth_run()
    assert any(d > 0 and a == d for j in jobs for d, a in zip(j.req.spec_drafted, j.req.spec_accepted)), \
        "no step accepted all its drafts (the test lost its teeth)"
    with pytest.raises(AssertionError, match="accepted tokens \\+ 1"):
        check_outputs("llama", jobs)


def test_teeth_counting_drafts_as_verified_kv_is_caught(monkeypatch) -> None:
    """Booking a verify batch like any other (``num_cached += extend_len``) counts rejected
    drafts' KV as the request's: the next step attends over garbage."""
    monkeypatch.setattr(SpeculativeLoop, "book", SyncLoop.book)
    with pytest.raises((AssertionError, ValueError)):  # wrong tokens, or a rollback past the row's pages
        check_outputs("llama", teeth_run())


def test_teeth_keeping_rejected_drafts_pages_is_caught(monkeypatch) -> None:
    """Without the rollback the tokens stay right, but a request keeps pages that hold nothing
    it verified: the page check after the step catches it."""
    monkeypatch.setattr(speculative_module, "release_unverified_pages", lambda kv, req: None)
    with pytest.raises(AssertionError, match="pages for"):
        teeth_run()
