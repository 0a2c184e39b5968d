"""Lesson 11: the MoE model served by the engine of lessons 4-9, tokens identical to HF alone.

Run: pytest lessons/l11

The engine never learns that the model is a mixture of experts: the builder gives the model
lesson 11's ``MoELayers`` and everything else (paged KV, continuous batching, the radix cache,
chunked prefill, overlap, the graph runner's static buffers, tensor parallelism) is unchanged.
Each test runs one workload (requests joining and leaving a batch of at most four, half of them
sharing a prefix) and compares every request with HF generating it alone.
"""

from __future__ import annotations

import functools
import os
import random

import pytest

from minisgl import LLM, SamplingParams
from minisgl.testing import SPARSE_MOE_KWARGS, HFReference, distinct_fraction, process_alive, tiny_checkpoint

MODULE = os.path.splitext(os.path.basename(__file__))[0]
# name -> (architecture, tiny_checkpoint overrides)
CHECKPOINTS = {"every_layer": ("qwen3_moe", {}), "sparse_step": ("qwen3_moe", SPARSE_MOE_KWARGS),
               "shared_expert": ("qwen2_moe", {})}
BASE = {"max_running": 4, "max_seq_len": 96, "page_size": 4}
# Lesson 4's engine (every later feature off), then one feature at a time, then all of them.
FEATURES = {
    "lesson 4": dict(prefix_cache=False, chunked_prefill_size=None, overlap=False, cuda_graph_max_bs=0),
    "radix cache": dict(prefix_cache=True, chunked_prefill_size=None, overlap=False, cuda_graph_max_bs=0),
    "chunked prefill": dict(prefix_cache=False, chunked_prefill_size=4, overlap=False, cuda_graph_max_bs=0),
    "overlap": dict(prefix_cache=False, chunked_prefill_size=None, overlap=True, cuda_graph_max_bs=0),
    "graph runner": dict(prefix_cache=False, chunked_prefill_size=None, overlap=False, cuda_graph_max_bs=3),
    "all": dict(prefix_cache=True, chunked_prefill_size=8, overlap=True, cuda_graph_max_bs=4),
}


def checkpoint(name: str, **kw):
    arch, overrides = CHECKPOINTS[name]
    return tiny_checkpoint(arch, **overrides, **kw)


@pytest.fixture(autouse=True)
def importable_from_the_ranks(monkeypatch) -> None:
    """Rank processes inherit ``sys.path``: put this folder on it, so ``rank_init`` can name
    this module's bug function."""
    monkeypatch.syspath_prepend(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def workload() -> tuple[list[list[int]], list[int]]:
    """Eight prompts of 1..40 tokens, every second one behind a shared 20-token prefix; 32..40
    new tokens each."""
    rng = random.Random("l11")
    shared = [rng.randrange(8, 512) for _ in range(20)]
    prompts = [[rng.randrange(8, 512) for _ in range(rng.randint(1, 20))] for _ in range(8)]
    prompts = [shared + p if i % 2 else p for i, p in enumerate(prompts)]
    return prompts, [rng.randint(32, 40) for _ in prompts]


@functools.cache
def expected(name: str) -> list[list[int]]:
    hf = HFReference(checkpoint(name))
    return [hf.greedy(p, n) for p, n in zip(*workload())]


def generate(llm: LLM) -> list:
    prompts, max_tokens = workload()
    return llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens], progress=False)


@pytest.mark.parametrize("feature", FEATURES)
def test_every_engine_feature_matches_hf(feature: str) -> None:
    llm = LLM(checkpoint("every_layer"), **BASE, **FEATURES[feature])
    assert type(llm.model.model.layers[0].mlp).__name__ == "SparseMoE"
    outs = generate(llm)
    assert [o.token_ids for o in outs] == expected("every_layer")
    assert distinct_fraction([t for o in outs for t in o.token_ids]) > 0.5
    if FEATURES[feature]["prefix_cache"]:
        assert sum(o.num_cached_tokens for o in outs) >= 3 * 20, "later requests must reuse the shared prefix"
    if FEATURES[feature]["cuda_graph_max_bs"]:
        assert sum(llm.engine.runner.stats.replays.values()) > 0, "decode steps must go through the graph runner"


@pytest.mark.parametrize("name", ["sparse_step", "shared_expert"])
@pytest.mark.parametrize("feature", ["lesson 4", "all"])
def test_other_checkpoints_match_hf(name: str, feature: str) -> None:
    """Dense layers between sparse ones and top-k weights not renormalised; Qwen2-MoE's shared expert."""
    outs = generate(LLM(checkpoint(name), **BASE, **FEATURES[feature]))
    assert [o.token_ids for o in outs] == expected(name)


def test_stacked_layout_serves_the_same_tokens() -> None:
    outs = generate(LLM(checkpoint("every_layer", expert_layout="stacked"), **BASE))
    assert [o.token_ids for o in outs] == expected("every_layer")


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_tp2_matches_hf(name: str) -> None:
    """Lesson 9's tensor parallelism over two CPU processes (gloo): each rank holds half of
    every expert's intermediate features (and half of the heads, of the dense MLPs and of the
    vocabulary); the experts' partial sums are all-reduced once per layer."""
    with LLM(checkpoint(name), tp_size=2, **BASE, chunked_prefill_size=16) as llm:
        pids = list(llm.core.ranks.pids)
        outs = generate(llm)
    assert not any(process_alive(p) for p in pids), "a rank process survived close()"
    assert [o.token_ids for o in outs] == expected(name)


def bug_every_rank_loads_rank_zeros_experts(rank: int) -> None:
    """The classic: every rank reads the first slice of each expert (the rank ignored when
    slicing), so the all-reduce adds rank 0's half twice and rank 1's half never."""
    from minisgl.layers.moe import Experts

    original = Experts.checkpoint_pieces
    Experts.checkpoint_pieces = lambda self, key, tp_rank: original(self, key, 0)


def test_tp2_catches_experts_sliced_for_the_wrong_rank() -> None:
    with LLM(checkpoint("every_layer"), tp_size=2, **BASE, rank_init=f"{MODULE}:bug_every_rank_loads_rank_zeros_experts") as llm:
        outs = generate(llm)
    wrong = sum(o.token_ids != want for o, want in zip(outs, expected("every_layer")))
    assert wrong >= len(outs) - 1, "the parity check must notice experts sliced for the wrong rank"
