"""Lesson 4: the offline ``LLM`` API, end to end, against HF run alone.

Run: pytest lessons/l04

``LLM(path).generate(prompts, sampling_params)`` accepts text, chat messages (rendered with the
checkpoint's chat template) and token ids, mixed in one call; outputs come back in input order
whatever order the requests finished in. A bad prompt anywhere in the list raises before
anything runs and leaves nothing queued or reserved.
"""

from __future__ import annotations

import functools
import random

import pytest

from minisgl import LLM, SamplingParams
from minisgl.scheduler.scheduler import RequestTooLongError
from minisgl.testing import TEST_PROMPTS, HFReference, tiny_checkpoint

ARCH = "llama"  # two EOS ids and a chat template with special header tokens
NUM_PAGES, PAGE_SIZE, MAX_RUNNING, MAX_SEQ_LEN = 128, 4, 16, 256
CHAT = [
    {"role": "system", "content": "You are a tiny model."},
    {"role": "user", "content": "What does a radix tree remember?"},
]



@functools.cache
def llm() -> LLM:
    return LLM(tiny_checkpoint(ARCH), num_pages=NUM_PAGES, page_size=PAGE_SIZE, max_running=MAX_RUNNING, prefix_cache=False,
               chunked_prefill_size=None, overlap=False, max_seq_len=MAX_SEQ_LEN)  # lesson 4's engine


@functools.cache
def hf_greedy(prompt: tuple[int, ...], n: int, stop: tuple[int, ...] | None = None) -> list[int]:
    return HFReference(tiny_checkpoint(ARCH)).greedy(list(prompt), n, stop_token_ids=stop)


def assert_nothing_left(engine: LLM) -> None:
    sched = engine.scheduler
    assert not sched.waiting and not sched.running
    assert sched.kv.allocator.num_free == NUM_PAGES
    assert sched.kv.page_table.num_free_rows == MAX_RUNNING


def test_text_chat_and_token_prompts_in_input_order(monkeypatch) -> None:
    engine, tok = llm(), llm().tokenizer
    token_prompt = [300, 301, 17, 250, 99, 42]
    prompts = [TEST_PROMPTS[3], CHAT, token_prompt, TEST_PROMPTS[0]]
    max_tokens = [40, 36, 8, 32]  # the first prompt finishes last, the token-id prompt first
    finished: list[int] = []
    step = engine.scheduler.step
    monkeypatch.setattr(engine.scheduler, "step", lambda: [finished.append(r.rid) or r for r in step()])

    outs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens], progress=False)

    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    expected_ids = [tok.encode(TEST_PROMPTS[3]), tok.encode(rendered, add_special_tokens=False), token_prompt,
                    tok.encode(TEST_PROMPTS[0])]
    assert [o.prompt_token_ids for o in outs] == expected_ids
    assert expected_ids[1][0] == tok.convert_tokens_to_ids("<|begin_of_text|>"), "the chat template was applied"
    assert tok.convert_tokens_to_ids("<|start_header_id|>") in expected_ids[1]
    for ids, n, out in zip(expected_ids, max_tokens, outs):
        assert out.token_ids == hf_greedy(tuple(ids), n)
        assert out.finish_reason == "length" and len(out.token_ids) == n
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
    assert sorted(finished) != finished, "requests finished out of input order; outputs are still in order"
    assert_nothing_left(engine)


def test_a_single_bare_prompt_of_each_kind() -> None:
    engine = llm()
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for prompt in (TEST_PROMPTS[1], CHAT, [300, 301, 17]):
        (single,) = engine.generate(prompt, params, progress=False)
        (listed,) = engine.generate([prompt], params, progress=False)
        assert single == listed and len(single.token_ids) == 12
    assert engine.generate([], params, progress=False) == []


@functools.cache
def prompt_that_emits_eos(max_tokens: int) -> tuple[int, ...]:
    """A prompt whose HF greedy run emits an EOS id within ``max_tokens`` (rare with random weights)."""
    eos = set(llm().config.eos_token_ids)
    rng = random.Random("llm-eos")
    for _ in range(600):
        prompt = tuple(rng.randrange(8, 512) for _ in range(rng.randint(3, 40)))
        free_run = hf_greedy(prompt, max_tokens)
        if eos & set(free_run[2:]):  # not in the first two tokens, so ignore_eos visibly runs on
            return prompt
    raise AssertionError("no prompt among 600 emits EOS: has the tiny checkpoint changed?")


def test_finish_reasons_stop_and_length() -> None:
    engine = llm()
    eos = tuple(engine.config.eos_token_ids)
    assert len(eos) == 2, "Llama 3 style: two EOS ids"
    eos_prompt = list(prompt_that_emits_eos(40))
    user_prompt = engine.tokenizer.encode(TEST_PROMPTS[2])
    user_stop = hf_greedy(tuple(user_prompt), 40)[12]
    prompts = [eos_prompt, eos_prompt, user_prompt, user_prompt]
    params = [
        SamplingParams(max_tokens=40),  # stops at the model's EOS
        SamplingParams(max_tokens=40, ignore_eos=True),  # runs through it
        SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=[user_stop]),  # a user stop id still counts
        SamplingParams(max_tokens=5),
    ]
    outs = engine.generate(prompts, params, progress=False)
    assert [o.finish_reason for o in outs] == ["stop", "length", "stop", "length"]
    assert outs[0].token_ids == hf_greedy(tuple(eos_prompt), 40, eos) and outs[0].token_ids[-1] in eos
    assert outs[1].token_ids == hf_greedy(tuple(eos_prompt), 40) and len(outs[1].token_ids) == 40
    assert outs[2].token_ids == hf_greedy(tuple(user_prompt), 40, (user_stop,)) and outs[2].token_ids[-1] == user_stop
    assert outs[3].token_ids == hf_greedy(tuple(user_prompt), 5)
    special = set(engine.tokenizer.all_special_ids)
    assert outs[0].text == engine.tokenizer.decode([t for t in outs[0].token_ids if t not in special])
    assert_nothing_left(engine)


@pytest.mark.parametrize(
    "bad, error",
    [
        (list(range(8, 8 + 230)), RequestTooLongError),  # 230 + 32 > max_seq_len 256
        ([], TypeError),  # an empty prompt
        ([8, 9, 100000], ValueError),  # a token id outside the vocabulary
    ],
    ids=["too-long", "empty", "out-of-vocab"],
)
def test_one_bad_prompt_among_good_ones_raises_and_leaves_nothing(bad, error) -> None:
    engine = llm()
    good = [TEST_PROMPTS[1], [300, 301, 17], TEST_PROMPTS[2]]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    with pytest.raises(error):
        engine.generate(good[:2] + [bad] + good[2:], params, progress=False)
    assert_nothing_left(engine)
    # The engine is still usable, and the good prompts alone give HF's tokens.
    outs = engine.generate(good, params, progress=False)
    assert [o.token_ids for o in outs] == [hf_greedy(tuple(o.prompt_token_ids), 32) for o in outs]
    assert_nothing_left(engine)


def test_mismatched_sampling_params_list_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 prompts but 3 sampling params"):
        llm().generate(["a", "b"], [SamplingParams()] * 3, progress=False)
    assert_nothing_left(llm())
