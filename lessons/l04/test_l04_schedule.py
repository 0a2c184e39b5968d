"""Lesson 4: what admission and batch building promise besides the tokens.

Run: pytest lessons/l04

The parity tests (``test_l04_batching.py``) prove that every request gets Hugging Face's tokens;
these check the promises of ``WholePrompts.next_batch`` and ``Scheduler.build_batch`` that a
batch can break without changing a token:

* the prefill token budget: each step admits prompts first come first served until the next
  one would not fit in ``max_prefill_tokens`` (counted in tokens); a prompt longer than the
  whole budget still runs, alone, as the first of a step;
* every batch goes through ``loop.batch_built`` once, before it runs (lesson 7's loop hooks
  there);
* ``build_batch`` on rows of every kind, built by hand: a prompt, a decode row, the first
  ``num_new`` tokens of a prompt (a row that does not sample), each row's positions, which
  rows sample and the logits index of each, and the batch's ``mode`` (``"prefill"``,
  ``"decode"``, ``"mixed"``).
"""

from __future__ import annotations

import random

import torch

from minisgl.attention.paged import ReferencePagedBackend
from minisgl.core import Batch, Req
from minisgl.engine.builder import make_engine
from minisgl.engine.builder import make_scheduler as build_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.scheduler import Scheduler, SyncLoop
from minisgl.testing import hf_greedy_tokens, tiny_model

ARCH = "llama"


class RecordingLoop(SyncLoop):
    """Lesson 4's loop; it checks that every batch it runs was announced through
    ``batch_built`` exactly once, and writes down what each step ran."""

    def __init__(self) -> None:
        self.built: list[Batch] = []
        self.trace: list[tuple[str, list[int], int]] = []  # (mode, request ids, tokens)

    def batch_built(self, batch: Batch) -> None:
        self.built.append(batch)

    def step(self, sched: Scheduler, batch: Batch | None) -> list[Req]:
        if batch is not None:
            announced = sum(b is batch for b in self.built)
            assert announced == 1, f"a batch must go through loop.batch_built once before it runs ({announced} times)"
            self.trace.append((batch.mode, [r.rid for r in batch.reqs], int(batch.input_ids.numel())))
        return super().step(sched, batch)


def make_scheduler(max_prefill_tokens: int, max_running: int = 16) -> tuple[Scheduler, RecordingLoop]:
    model = tiny_model(ARCH)
    pool = PagedKVPool.for_model(model.config, 256, 4, torch.float32, "cpu")
    config = EngineConfig(max_running=max_running, max_prefill_tokens=max_prefill_tokens, max_seq_len=256,
                          prefix_cache=False, chunked_prefill_size=None, overlap=False)
    sched = build_scheduler(make_engine(model, ReferencePagedBackend(pool), config), config, (),
                            model.config.vocab_size)
    sched.loop = loop = RecordingLoop()
    return sched, loop


def prompts(seed: str, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, 512) for _ in range(n)] for n in lengths]


def run(sched: Scheduler, reqs: list[Req], max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if not sched.has_work:
            return
        sched.step()
    raise AssertionError(f"still busy after {max_steps} steps: {len(sched.waiting)} waiting, {len(sched.running)} running")


def assert_hf(reqs: list[Req], ps: list[list[int]], n: int) -> None:
    for req, p in zip(reqs, ps):
        assert tuple(req.output_ids) == hf_greedy_tokens(ARCH, tuple(p), n), f"request {req.rid} differs from HF alone"


def test_the_prefill_token_budget_caps_each_step() -> None:
    """Six 15-token prompts arrive together under a 40-token budget: two fit per step
    (15 + 15 = 30; a third would make 45), so three prefill steps admit them two by two."""
    sched, loop = make_scheduler(max_prefill_tokens=40)
    ps = prompts("budget", [15] * 6)
    reqs = [sched.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True)) for p in ps]
    run(sched, reqs)
    prefills = [(rids, tokens) for mode, rids, tokens in loop.trace if mode == "prefill"]
    rid = [r.rid for r in reqs]
    assert prefills == [([rid[0], rid[1]], 30), ([rid[2], rid[3]], 30), ([rid[4], rid[5]], 30)], (
        f"each step admits prompts until the next would exceed 40 tokens: {prefills}")
    assert loop.trace[:3] == [("prefill", rids, n) for rids, n in prefills], "admission comes before decoding"
    assert_hf(reqs, ps, 3)


def test_a_prompt_longer_than_the_budget_goes_alone() -> None:
    """Budget 16: A (10 tokens) is admitted, B (30) does not fit what is left and waits; next
    step B goes alone, as the first of the step (the budget goes below 0); then C and D (5 + 4)."""
    sched, loop = make_scheduler(max_prefill_tokens=16)
    ps = prompts("long", [10, 30, 5, 4])
    reqs = [sched.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in ps]
    run(sched, reqs)
    a, b, c, d = (r.rid for r in reqs)
    prefills = [rids for mode, rids, _ in loop.trace if mode == "prefill"]
    assert prefills == [[a], [b], [c, d]], f"a prompt longer than the budget must run alone: {prefills}"
    assert_hf(reqs, ps, 4)


def test_every_batch_is_announced_to_the_loop_once_before_it_runs() -> None:
    sched, loop = make_scheduler(max_prefill_tokens=64)
    ps = prompts("hook", [6, 9, 3])
    reqs = [sched.add_request(p, SamplingParams(max_tokens=5, ignore_eos=True)) for p in ps]
    run(sched, reqs)
    assert len(loop.trace) >= 5 and len(loop.built) == len(loop.trace), (
        f"{len(loop.built)} batches announced for {len(loop.trace)} run")
    assert_hf(reqs, ps, 5)


def test_build_batch_by_hand_prompt_decode_and_a_cut_prompt() -> None:
    """Rows of every kind through ``build_batch``: a prompt alone ("prefill"), a decode row with
    the first 4 tokens of another prompt (``num_new``: that row writes KV and does not sample,
    "mixed"), the rest of that prompt beside a decode row, then two decode rows ("decode").
    The tokens still equal Hugging Face's."""
    sched, loop = make_scheduler(max_prefill_tokens=64)
    pa, pb = prompts("by-hand", [7, 9])
    a = sched.add_request(pa, SamplingParams(max_tokens=4, ignore_eos=True))
    b = sched.add_request(pb, SamplingParams(max_tokens=3, ignore_eos=True))

    def run_batch(batch: Batch, samples: int) -> None:
        assert loop.built[-1] is batch, "build_batch hands the batch to loop.batch_built"
        tokens = sched.engine.step(batch)
        assert len(tokens) == samples
        sched.process(batch, tokens)

    assert sched.admit(a, [], None)
    batch = sched.build_batch([a])
    assert batch.mode == "prefill" and batch.decode_rows == [False] and batch.extend_lens == [7]
    assert batch.input_ids.tolist() == pa and batch.positions.tolist() == list(range(7))
    assert batch.samples == [True] and batch.logits_indices.tolist() == [6], "the logits of the prompt's last token"
    assert batch.input_ids.dtype == batch.positions.dtype == batch.logits_indices.dtype == torch.int64
    run_batch(batch, 1)

    assert sched.admit(b, [], None)
    batch = sched.build_batch([a, b], [1, 4])  # a decodes; b's first 4 prompt tokens only
    assert batch.mode == "mixed" and batch.decode_rows == [True, False]
    assert batch.extend_lens == [1, 4] and batch.input_ids.tolist() == [a.output_ids[-1]] + pb[:4]
    assert batch.positions.tolist() == [7, 0, 1, 2, 3], "positions count within each request"
    assert batch.samples == [True, False], "a row that stops short of the prompt's end does not sample"
    assert batch.logits_indices.tolist() == [0], "one logits row per sampling row: a's only token"
    run_batch(batch, 1)
    assert b.num_cached == 4 and not b.output_ids

    batch = sched.build_batch([b, a])  # the rest of b's prompt, and a decode row
    assert batch.mode == "mixed" and batch.decode_rows == [False, True] and batch.extend_lens == [5, 1]
    assert batch.positions.tolist() == [4, 5, 6, 7, 8, 8]
    assert batch.samples == [True, True] and batch.logits_indices.tolist() == [4, 5]
    run_batch(batch, 2)

    batch = sched.build_batch([a, b])
    assert batch.mode == "decode" and batch.decode_rows == [True, True] and batch.extend_lens == [1, 1]
    assert batch.positions.tolist() == [9, 9] and batch.logits_indices.tolist() == [0, 1]
    run_batch(batch, 2)
    assert a.finish_reason == "length"

    run(sched, [b])
    assert tuple(a.output_ids) == hf_greedy_tokens(ARCH, tuple(pa), 4)
    assert tuple(b.output_ids) == hf_greedy_tokens(ARCH, tuple(pb), 3)
    assert sched.kv.allocator.num_free == sched.num_pages
