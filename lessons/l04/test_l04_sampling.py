"""Lesson 4: sampling inside a batch. Greedy settings equal HF; a seed makes a request reproducible.

Run: pytest lessons/l04

A seeded request draws from its own ``torch.Generator``, one draw per step, so its tokens must
not depend on what else shares its batches: alone, in a big batch, or joining a batch that is
already decoding. Every way of asking for greedy (``temperature=0``, ``top_k=1``, a tiny
``top_p``) must give exactly HF's greedy tokens, also when other requests in the same batch
sample. The unit tests of ``filter_logits`` and the statistics are in ``tests/test_sampler.py``.
"""

from __future__ import annotations

import functools
import random

import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import HFReference, distinct_fraction, tiny_checkpoint

ARCH = "qwen3"
NEW_TOKENS = 32



@functools.cache
def llm() -> LLM:
    return LLM(tiny_checkpoint(ARCH), num_pages=512, page_size=4, max_running=32, prefix_cache=False, chunked_prefill_size=None,
               overlap=False)


@functools.cache
def hf_greedy(prompt: tuple[int, ...], n: int = NEW_TOKENS) -> list[int]:
    return HFReference(tiny_checkpoint(ARCH)).greedy(list(prompt), n)


def prompts(n: int, seed: str = "sampling") -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, 512) for _ in range(rng.randint(2, 40))] for _ in range(n)]


def sampled(seed: int | None, **kw) -> SamplingParams:
    return SamplingParams(temperature=kw.pop("temperature", 1.0), seed=seed, max_tokens=NEW_TOKENS, ignore_eos=True, **kw)


def greedy_ways() -> list[SamplingParams]:
    """Every way of asking for greedy tokens; the non-trivial ones go through the filtering path."""
    base = dict(max_tokens=NEW_TOKENS, ignore_eos=True)
    return [
        SamplingParams(temperature=0.0, **base),
        SamplingParams(temperature=0.0, top_k=5, top_p=0.5, seed=3, **base),  # temperature 0 wins
        SamplingParams(temperature=1.3, top_k=1, **base),
        SamplingParams(temperature=1.3, top_k=1, seed=11, **base),
        SamplingParams(temperature=1.0, top_p=1e-6, **base),  # the nucleus is just the best token
        SamplingParams(temperature=0.8, top_p=1e-6, top_k=50, seed=12, **base),
    ]


def test_every_greedy_setting_equals_hf_even_beside_sampling_requests() -> None:
    ways = greedy_ways()
    ps = prompts(len(ways))
    noise = prompts(6, "noise")  # sampling neighbours, seeded and unseeded, in the same batches
    params = ways + [sampled(seed=i if i % 2 else None, top_k=40) for i in range(len(noise))]
    outs = llm().generate(ps + noise, params, progress=False)
    for prompt, way, out in zip(ps, ways, outs):
        assert out.token_ids == hf_greedy(tuple(prompt)), f"{way} is not greedy"
    assert not (ways[4].greedy or ways[5].greedy), "the top_p cases must exercise the sampling path"


def run_with_scheduler(target: list[int], params: SamplingParams, neighbours: list[list[int]], join_after: int) -> list[int]:
    """Start ``neighbours`` (sampling requests of their own), step ``join_after`` times, then add
    ``target``; return its tokens. Its batches then differ in size and membership at every step."""
    sched = llm().scheduler
    for i, p in enumerate(neighbours):
        sched.add_request(p, SamplingParams(temperature=0.9, seed=100 + i, max_tokens=8 + 5 * i, ignore_eos=True))
    for _ in range(join_after):
        sched.step()
    req = sched.add_request(target, params)
    for _ in range(500):
        if not sched.has_work:
            break
        sched.step()
    assert req.finish_reason == "length"
    return req.output_ids


def test_seeded_sampling_is_reproducible_in_any_batch() -> None:
    target, *others = prompts(9, "seeded")
    params = sampled(seed=1234, top_k=100, top_p=0.95)
    alone = llm().generate([target], params, progress=False)[0].token_ids
    assert len(alone) == NEW_TOKENS

    # Same seed, different company: in the middle of one big prefill, beside greedy and unseeded
    # requests; and joining mid-flight a batch that is already decoding, twice with different timing.
    batch = others[:4] + [target] + others[4:]
    batch_params = [sampled(None) if i % 2 else SamplingParams(max_tokens=20, ignore_eos=True) for i in range(len(others))]
    batch_params.insert(4, params)
    in_batch = llm().generate(batch, batch_params, progress=False)[4].token_ids
    joined_late = run_with_scheduler(target, params, others, join_after=5)
    joined_later = run_with_scheduler(target, params, others[:3], join_after=12)
    assert in_batch == alone and joined_late == alone and joined_later == alone

    # Two requests with the same seed in the same batch each own a generator: identical tokens.
    twins = llm().generate([target, others[0], target], [params, sampled(None), params], progress=False)
    assert twins[0].token_ids == twins[2].token_ids == alone

    # Teeth: the seed matters and the sampler really samples.
    other_seed = llm().generate([target], sampled(seed=4321, top_k=100, top_p=0.95), progress=False)[0].token_ids
    assert other_seed != alone
    greedy = hf_greedy(tuple(target))
    assert sum(a == b for a, b in zip(alone, greedy)) < NEW_TOKENS // 2, "temperature 1 must not be greedy"
    assert distinct_fraction(alone) > 0.5


def test_unseeded_sampling_differs_between_identical_requests() -> None:
    """Eight copies of one prompt, no seed, in one batch: they share the batch's random stream,
    so they must not all come out the same (a sampler that reuses one draw for every row would)."""
    target = prompts(1, "unseeded")[0]
    torch.manual_seed(0)
    outs = llm().generate([target] * 8, sampled(None), progress=False)
    assert len({tuple(o.token_ids) for o in outs}) == 8
    assert all(o.finish_reason == "length" and len(o.token_ids) == NEW_TOKENS for o in outs)
