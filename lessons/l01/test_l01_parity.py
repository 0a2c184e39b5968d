"""Lesson 1: a contiguous KV cache gives exactly Hugging Face's greedy tokens.

Run: pytest lessons/l01
"""

from __future__ import annotations

import pytest
import torch

from minisgl.attention.base import NoCacheBackend
from minisgl.attention.contiguous import ContiguousBackend
from minisgl.generate import SequenceGenerator, generate, generate_without_cache
from minisgl.kvcache import ContiguousKVCache, KVCacheFullError
from minisgl.models import load_model
from minisgl.testing import ARCHITECTURES, TEST_PROMPTS, HFReference, distinct_fraction, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer

NEW_TOKENS = 40


def setup(arch: str):
    path = tiny_checkpoint(arch)
    return load_model(path), HFReference(path), load_tokenizer(path)


def contiguous_kv(model, max_seq_len: int = 256, backend_cls=ContiguousBackend):
    return backend_cls(ContiguousKVCache.for_model(model.config, max_seq_len, torch.float32, "cpu"))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_tokens_identical_to_hf(arch: str) -> None:
    model, hf, tok = setup(arch)
    outputs = []
    for prompt in TEST_PROMPTS:
        ids = tok.encode(prompt)
        ours = generate(model, contiguous_kv(model), ids, NEW_TOKENS)
        theirs = hf.greedy(ids, NEW_TOKENS)
        assert ours == theirs, f"{arch}: mismatch for prompt {prompt!r}"
        # Teeth: a model that repeats itself would make this test meaningless.
        assert len(ours) == NEW_TOKENS and distinct_fraction(ours) > 0.5, ours
        outputs.append(tuple(ours))
    assert len(set(outputs)) == len(outputs), "different prompts must give different generations"
    assert len({len(tok.encode(p)) for p in TEST_PROMPTS}) >= 4, "prompts must differ in length"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stops_at_any_stop_token(arch: str) -> None:
    model, hf, tok = setup(arch)
    ids = tok.encode(TEST_PROMPTS[1])
    free_run = hf.greedy(ids, NEW_TOKENS)
    # Two stop ids, as Llama 3 has (<|end_of_text|>, <|eot_id|>): the one that occurs first must end it.
    stops = [free_run[20], free_run[6]]
    ours = generate(model, contiguous_kv(model), ids, NEW_TOKENS, stop_token_ids=stops)
    assert ours == hf.greedy(ids, NEW_TOKENS, stop_token_ids=stops)
    assert ours[-1] in stops and len(ours) <= 7


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_incremental_decode_equals_full_forward(arch: str) -> None:
    """Logits of every decode step (with the cache) equal a forward over the whole sequence (no cache)."""
    model, hf, tok = setup(arch)
    ids = tok.encode(TEST_PROMPTS[3])
    gen = SequenceGenerator(model, contiguous_kv(model), ids, 16)
    step_logits = []
    while not gen.finished:
        gen.step()
        step_logits.append(gen.last_logits)
    full = ids + gen.output_ids[:-1]
    full_logits = model(torch.tensor(full), torch.arange(len(full)), NoCacheBackend())
    torch.testing.assert_close(torch.stack(step_logits), full_logits[len(ids) - 1:], atol=1e-4, rtol=1e-4)
    # ... and both equal Hugging Face's logits.
    _, hf_logits = hf.greedy_with_logits(ids, 16)
    torch.testing.assert_close(torch.stack(step_logits), hf_logits, atol=1e-4, rtol=1e-4)


def test_without_cache_gives_same_tokens() -> None:
    model, _, tok = setup("qwen3")
    ids = tok.encode(TEST_PROMPTS[2])
    assert generate_without_cache(model, ids, 12) == generate(model, contiguous_kv(model), ids, 12)


class OffByOneBackend(ContiguousBackend):
    """The classic bug: K written one row too far (e.g. using cur_len + 1 as the write offset)."""

    def store(self, layer_id, k, v):
        start = self.num_cached + 1
        self.cache.k[layer_id][start:start + k.shape[0]] = k
        self.cache.v[layer_id][self.num_cached:self.num_cached + v.shape[0]] = v


class WrongLayerBackend(ContiguousBackend):
    """Another classic: every layer writes into layer 0's cache."""

    def store(self, layer_id, k, v):
        super().store(0, k, v)

    def forward(self, q, k, v, layer_id):
        self.store(layer_id, k, v)
        from minisgl.attention.dense import dense_causal_attention

        end = self.num_cached + q.shape[0]
        return dense_causal_attention(q, self.cache.k[layer_id][:end], self.cache.v[layer_id][:end], self.num_cached)


@pytest.mark.parametrize("buggy", [OffByOneBackend, WrongLayerBackend])
def test_parity_check_catches_a_corrupted_cache(buggy) -> None:
    model, hf, tok = setup("llama")
    mismatches = 0
    for prompt in TEST_PROMPTS:
        ids = tok.encode(prompt)
        mismatches += generate(model, contiguous_kv(model, backend_cls=buggy), ids, NEW_TOKENS) != hf.greedy(ids, NEW_TOKENS)
    assert mismatches >= len(TEST_PROMPTS) - 1, "the parity check must notice a corrupted cache"


def test_cache_overflow_is_a_clear_error() -> None:
    model, _, tok = setup("qwen2")
    ids = tok.encode(TEST_PROMPTS[3])
    with pytest.raises(KVCacheFullError, match="max_seq_len"):
        generate(model, contiguous_kv(model, max_seq_len=len(ids) + 3), ids, 10)
