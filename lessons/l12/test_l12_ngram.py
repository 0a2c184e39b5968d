"""Lesson 12: the n-gram proposer, and the settings that switch speculative decoding on.

Run: pytest lessons/l12

``NgramProposer.lookup`` finds the longest recent suffix of a request's tokens earlier in the
same tokens and proposes what followed it. These tests pin its choices (longest suffix first,
most recent occurrence, continuations that run into the suffix, no match -> no proposal)
against a naive model, and check the settings: ``speculative`` and ``num_speculative_tokens``
are declared once (``EngineConfig``) and reach ``LLM`` and ``python -m minisgl`` alike.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.__main__ import parse_args
from minisgl.engine.config import EngineConfig
from minisgl.scheduler.ngram import NgramProposer


def naive_lookup(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The rule spelled out: for n from long to short, every earlier occurrence of the last n
    tokens, the latest one wins, and it proposes the k tokens after it, taking the sequence to
    go on repeating with period len(tokens) - (where that occurrence ends)."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        starts = [i for i in range(len(tokens) - n) if tokens[i:i + n] == suffix]
        if starts:
            period = len(tokens) - (max(starts) + n)
            extended = list(tokens)
            while len(extended) < len(tokens) + k:
                extended.append(extended[-period])
            return extended[len(tokens):len(tokens) + k]
    return []


def test_the_longest_suffix_and_its_latest_occurrence_win() -> None:
    p = NgramProposer(max_ngram=3)
    #        0  1  2  3  4  5  6  7  8  9  10
    tokens = [5, 6, 7, 1, 6, 7, 2, 9, 5, 6, 7]
    assert p.lookup(tokens, 3) == [1, 6, 7]  # "5 6 7" (n=3) at 0 beats "6 7" at 4, which is more recent
    assert NgramProposer(max_ngram=2).lookup(tokens, 3) == [2, 9, 5]  # "6 7": the latest is at 4
    assert p.lookup(tokens, 2) == [1, 6]  # k of them
    assert p.lookup([1, 2, 3, 1, 2], 4) == [3, 1, 2, 3]  # runs into the end: the loop goes on (period 3)
    assert p.lookup([4, 4, 4], 5) == [4, 4, 4, 4, 4]  # a one-token loop
    assert p.lookup([1, 2, 3, 4], 4) == []  # nothing repeats: no proposal, a plain decode step
    assert p.lookup([7], 4) == [] and p.lookup([], 4) == []
    assert p.lookup(tokens, 0) == []
    assert NgramProposer(max_ngram=3, min_ngram=2).lookup([1, 2, 9, 2], 3) == []  # "2" alone is too short


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=40), st.integers(1, 6), st.integers(1, 4), st.integers(0, 3))
def test_lookup_agrees_with_the_naive_rule(tokens: list[int], k: int, max_ngram: int, shorter: int) -> None:
    min_ngram = max(1, max_ngram - shorter)
    assert NgramProposer(max_ngram, min_ngram).lookup(tokens, k) == naive_lookup(tokens, k, max_ngram, min_ngram)


def test_propose_honours_each_requests_limit() -> None:
    class Fake:
        def __init__(self, ids: list[int]) -> None:
            self.all_ids = ids

    rng = random.Random(0)
    loop = [rng.randrange(100) for _ in range(5)] * 3
    out = NgramProposer().propose([Fake(loop), Fake(loop), Fake([1, 2, 3])], [4, 0, 4])
    assert out == [loop[:4], [], []]  # the pattern repeats: the next 4 are its first 4


# --- the settings ------------------------------------------------------------------------------


def test_settings_are_declared_once_and_checked() -> None:
    c = EngineConfig(speculative="ngram", num_speculative_tokens=3)
    assert (c.speculative, c.num_speculative_tokens) == ("ngram", 3)
    assert EngineConfig().speculative is None and EngineConfig().num_speculative_tokens == 4
    d = EngineConfig(speculative="draft", draft_model=Path("/some/draft"))
    assert (d.speculative, d.draft_model) == ("draft", "/some/draft")  # a path is kept as a string (JSON to ranks)
    with pytest.raises(ValueError, match="speculative='draft' needs draft_model"):
        EngineConfig(speculative="draft")
    with pytest.raises(ValueError, match="EngineConfig.speculative must be None, 'ngram' or 'draft'"):
        EngineConfig(speculative="eagle")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="EngineConfig.num_speculative_tokens must be an integer >= 1"):
            EngineConfig(speculative="ngram", num_speculative_tokens=bad)
    with pytest.raises(ValueError, match="cuda_graph_max_bs=8: speculative decoding runs its verify steps eagerly"):
        EngineConfig(speculative="ngram", cuda_graph_max_bs=8)


def test_speculation_turns_overlap_and_graphs_off_when_resolved() -> None:
    """The lagged loop (lesson 7) plans step N+1 before it knows what step N accepted, and a
    graph (lesson 8) replays one-token rows: both are off with speculation, on without."""
    spec = EngineConfig(speculative="ngram").resolve(2048, cuda_available=True)
    assert (spec.overlap, spec.cuda_graph_max_bs) == (False, 0)
    plain = EngineConfig().resolve(2048, cuda_available=True)
    assert (plain.overlap, plain.cuda_graph_max_bs) == (True, 256)


def test_command_line_flags() -> None:
    args, _ = parse_args(["--speculative", "ngram", "--num-speculative-tokens", "6"])
    assert args.llm == {"speculative": "ngram", "num_speculative_tokens": 6}
    assert parse_args([])[0].llm == {}
    with pytest.raises(SystemExit):
        parse_args(["--speculative", "draft"])  # refused before any process starts (no --draft-model)
    args, _ = parse_args(["--speculative", "draft", "--draft-model", "demo-draft"])
    assert args.llm == {"speculative": "draft", "draft_model": "demo-draft"}


def test_speculation_is_loaded_only_by_its_setting(monkeypatch) -> None:
    """In a fresh interpreter, a generate with ``speculative="ngram"`` loads lesson 12's modules
    and neither lesson 7's lagged loop nor lesson 8's graph runner (both off with speculation);
    the layering check's runs of lessons 4-8 (``python -m tests.tools.layering``) show that
    without the setting no lesson-12 module is loaded."""
    from pathlib import Path

    from tests.tools import layering

    settings = dict(speculative="ngram", num_speculative_tokens=3, chunked_prefill_size=8)
    monkeypatch.setitem(layering.LESSON_SETTINGS, 12, settings)
    loaded = layering.modules_loaded_by_generate(12)
    assert {"minisgl.scheduler.speculative", "minisgl.scheduler.ngram", "minisgl.engine.verify"} <= set(loaded)
    assert not {"minisgl.scheduler.overlap", "minisgl.engine.overlap", "minisgl.engine.graph"} & set(loaded)
    modules = layering.scan(Path(__file__).resolve().parents[2] / "minisgl")
    assert layering.runtime_violations(modules, 12, loaded) == []
