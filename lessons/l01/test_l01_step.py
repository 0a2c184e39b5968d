"""Lesson 1: what one ``SequenceGenerator.step`` promises besides the tokens.

Run: pytest lessons/l01

The parity tests (``test_l01_parity.py``) prove the tokens; these prove the rest of the step's
contract, each with a loop that records what the generator asks of its KV: the finish reason
(a stop token wins over the length limit when both hold), the KV released exactly once when the
request finishes and never before, an error (from ``prepare`` or from the model) finishing the
request as ``"abort"`` with its KV released before it is re-raised, and a finished generator
refusing another step.
"""

from __future__ import annotations

import functools

import pytest
import torch

from minisgl.attention.contiguous import ContiguousBackend
from minisgl.generate import SequenceGenerator
from minisgl.kvcache import ContiguousKVCache, KVCacheFullError
from minisgl.models import load_model
from minisgl.testing import TEST_PROMPTS, HFReference, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer


@functools.cache
def setup(arch: str = "qwen3"):
    path = tiny_checkpoint(arch)
    return load_model(path), HFReference(path), load_tokenizer(path)


class RecordingKV:
    """Lesson 1's contiguous backend as the generator's ``SequenceKV``, recording every call."""

    def __init__(self, model, max_seq_len: int = 256) -> None:
        self.backend = ContiguousBackend(ContiguousKVCache.for_model(model.config, max_seq_len, torch.float32, "cpu"))
        self.prepared: list[tuple[int, int]] = []
        self.releases = 0

    def prepare(self, num_cached: int, num_new: int):
        assert self.releases == 0, "prepare after the KV was released"
        self.prepared.append((num_cached, num_new))
        return self.backend.prepare(num_cached, num_new)

    def release(self) -> None:
        self.releases += 1
        self.backend.release()


def test_length_finish_releases_the_kv_once_at_the_end() -> None:
    model, hf, tok = setup()
    ids = tok.encode(TEST_PROMPTS[1])
    kv = RecordingKV(model)
    gen = SequenceGenerator(model, kv, ids, 5)
    for i in range(5):
        assert not gen.finished and kv.releases == 0, "the KV is released only when the request finishes"
        token = gen.step()
        assert gen.output_ids[-1] == token and len(gen.output_ids) == i + 1
    assert gen.output_ids == hf.greedy(ids, 5)
    assert (gen.finished, gen.finish_reason) == (True, "length")
    assert kv.releases == 1, f"a finished request releases its KV exactly once (released {kv.releases} times)"
    P = len(ids)
    assert kv.prepared == [(0, P), (P, 1), (P + 1, 1), (P + 2, 1), (P + 3, 1)]


def test_a_stop_token_on_the_last_allowed_step_finishes_as_stop() -> None:
    """The stop token is checked first: it is the reason even when max_new_tokens is reached too."""
    model, hf, tok = setup()
    ids = tok.encode(TEST_PROMPTS[2])
    free_run = hf.greedy(ids, 12)
    k = next(i for i in range(3, 12) if free_run[i] not in free_run[:i])  # a token not seen before it
    kv = RecordingKV(model)
    gen = SequenceGenerator(model, kv, ids, k + 1, stop_token_ids=[free_run[k]])
    while not gen.finished:
        gen.step()
    assert gen.output_ids == free_run[: k + 1], "the stop token is kept in the output"
    assert gen.finish_reason == "stop", f"stop token and max_new_tokens at once: {gen.finish_reason!r}, not 'stop'"
    assert kv.releases == 1


def test_a_stop_token_releases_the_kv_once() -> None:
    model, hf, tok = setup()
    ids = tok.encode(TEST_PROMPTS[0])
    free_run = hf.greedy(ids, 10)
    kv = RecordingKV(model)
    gen = SequenceGenerator(model, kv, ids, 10, stop_token_ids=[free_run[3]])
    while not gen.finished:
        gen.step()
    assert gen.finish_reason == "stop" and gen.output_ids[-1] == free_run[3] and len(gen.output_ids) <= 4
    assert kv.releases == 1


def test_stepping_a_finished_generator_raises() -> None:
    model, _, tok = setup()
    kv = RecordingKV(model)
    gen = SequenceGenerator(model, kv, tok.encode(TEST_PROMPTS[1]), 2)
    gen.step()
    gen.step()
    assert gen.finished
    out, calls = list(gen.output_ids), len(kv.prepared)
    with pytest.raises(RuntimeError):
        gen.step()
    assert gen.output_ids == out and len(kv.prepared) == calls and kv.releases == 1, "a refused step changes nothing"


def test_a_full_cache_aborts_releases_and_reraises() -> None:
    """``prepare`` raises (the cache is full) at a decode step: the request ends as "abort", its
    KV is released, the error reaches the caller, and nothing more can be stepped."""
    model, hf, tok = setup()
    ids = tok.encode(TEST_PROMPTS[3])
    kv = RecordingKV(model, max_seq_len=len(ids) + 2)
    gen = SequenceGenerator(model, kv, ids, 10)
    for _ in range(3):
        gen.step()  # prefill and two decodes: positions 0 .. P+1 fill the cache
    out = list(gen.output_ids)
    with pytest.raises(KVCacheFullError):
        gen.step()
    assert (gen.finished, gen.finish_reason) == (True, "abort")
    assert kv.releases == 1, "an aborted request gives its KV back"
    assert gen.output_ids == out == hf.greedy(ids, 3), "a failed step records no token"
    with pytest.raises(RuntimeError):
        gen.step()


class FailingModel:
    """The model, failing at its ``fail_at``-th call (0-based) with a RuntimeError."""

    def __init__(self, model, fail_at: int) -> None:
        self.model, self.fail_at, self.calls = model, fail_at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls - 1 == self.fail_at:
            raise RuntimeError("injected model failure")
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("fail_at", [0, 2], ids=["prefill", "decode"])
def test_a_model_error_aborts_releases_and_reraises(fail_at: int) -> None:
    model, _, tok = setup()
    kv = RecordingKV(model)
    gen = SequenceGenerator(model, kv, tok.encode(TEST_PROMPTS[1]), 10)
    gen.model = FailingModel(model, fail_at)
    for _ in range(fail_at):
        gen.step()
    with pytest.raises(RuntimeError, match="injected model failure"):
        gen.step()
    assert (gen.finished, gen.finish_reason) == (True, "abort"), "an error in the model ends the request too"
    assert kv.releases == 1 and len(gen.output_ids) == fail_at
