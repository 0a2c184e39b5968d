"""Log-probabilities through the server (issue 30), as the official ``openai`` client sees them.

Run: pytest tests/test_server_logprobs.py

``/v1/completions`` takes ``logprobs`` (0..20) and answers in OpenAI's legacy format;
``/v1/chat/completions`` takes ``logprobs`` (true) and ``top_logprobs`` (0..20) and answers in
the chat format, streamed or not. The values are the offline engine's for the same greedy
request, the tokens spell the answer's text, and out-of-range values are 400s naming the
parameter. Every token has a name of its own (issue 43): ``logprobs: 5`` lists 5 alternatives at
every step, a special token named by its literal text, a piece of a character by its bytes.
"""

from __future__ import annotations

import functools
import re

import httpx
import openai
import pytest

from minisgl import LLM, SamplingParams
from minisgl.engine.local import GenerationOutput
from minisgl.testing import TEST_PROMPTS, tiny_checkpoint
from minisgl.testing.server import ServerProcess

ARCH = "qwen3"
MODEL = str(tiny_checkpoint(ARCH))
CHAT = [{"role": "user", "content": "What does a radix tree remember?"}]
SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}  # the tiny qwen3 tokenizer's
# Special token text in the prompt (as in a chat template's): on the tiny checkpoint the greedy answer
# to it samples <|endoftext|> and <|im_start|>, and has special tokens among its top 5.
SPECIAL_PROMPT = " <|im_start|>usersystem"


def name_bytes(name: str) -> bytes:
    """The bytes a token of this name adds: none for a special token, a piece of a character's
    own (``bytes:\\xe4``: printable ASCII as itself, any other byte as ``\\xNN``), any other
    token's text."""
    if name in SPECIALS:
        return b""
    if name.startswith("bytes:"):
        return re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m[1], 16)]), name[6:].encode())
    return name.encode()


def chat_bytes(name: str) -> bytes:
    """A chat token's ``bytes``: a special token's are those of its literal text."""
    return name.encode() if name in SPECIALS else name_bytes(name)


def spelled(names: list[str]) -> str:
    """The text that tokens of these names make (a character split over tokens shows once whole)."""
    return b"".join(name_bytes(n) for n in names).decode("utf-8", "replace")


def check_spelling(tokens: list[str], offsets: list[int], text: str) -> None:
    """The tokens spell ``text``, and each starts at its ``text_offset``: a token named by its text
    ends the text it added (which may begin with an earlier broken character's U+FFFD)."""
    assert spelled(tokens) == text
    ends = offsets[1:] + [len(text)]
    assert offsets[:1] == [0] and all(a <= b for a, b in zip(offsets, ends))
    for token, start, end in zip(tokens, offsets, ends):
        if token not in SPECIALS and not token.startswith("bytes:"):
            assert text[start:end].endswith(token), (token, text[start:end])


@pytest.fixture(scope="module")
def server():
    with ServerProcess(tiny_checkpoint(ARCH)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@functools.cache
def offline() -> LLM:
    return LLM(tiny_checkpoint(ARCH), max_seq_len=256, overlap=False, chunked_prefill_size=None, prefix_cache=False)


def offline_answer(prompt, max_tokens: int, logprobs: int) -> GenerationOutput:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    return offline().generate([prompt], params, progress=False)[0]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b))


def test_completions_logprobs_are_the_engines_in_openais_legacy_format(client) -> None:
    prompt = TEST_PROMPTS[1]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    ref = offline_answer(prompt, 12, 3)
    text, lp = out.choices[0].text, out.choices[0].logprobs
    assert text == ref.text
    check_spelling(lp.tokens, lp.text_offset, text)
    assert close(lp.token_logprobs, [e.logprob for e in ref.logprobs])
    for top, token, logprob, entry in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs, ref.logprobs):
        assert top[token] == logprob, "the chosen token is always among its top_logprobs"
        best = sorted(top.values(), reverse=True)
        assert close(best[:1], [entry.top[0][1]]) and len(top) <= 4
        assert all(any(abs(v - w) < 1e-4 for _, w in entry.top) or v == logprob for v in top.values())
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None, "no logprobs unless asked"


def test_chat_logprobs_and_top_logprobs_streamed_or_not(client) -> None:
    kw = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True})
    out = client.chat.completions.create(**kw)
    ref = offline_answer(CHAT, 10, 2)
    content = out.choices[0].logprobs.content
    assert out.choices[0].message.content == ref.text == spelled([c.token for c in content])
    assert close([c.logprob for c in content], [e.logprob for e in ref.logprobs])
    for c, entry in zip(content, ref.logprobs):
        assert bytes(c.bytes) == chat_bytes(c.token)
        assert len(c.top_logprobs) == 2 and close([t.logprob for t in c.top_logprobs], [v for _, v in entry.top])
        assert all(bytes(t.bytes) == chat_bytes(t.token) for t in c.top_logprobs)
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    streamed = [item for c in chunks for item in c.choices[0].logprobs.content]
    assert [item.model_dump() for item in streamed] == [item.model_dump() for item in content]
    shown, listed = "", []
    for c in chunks:  # each chunk carries the logprobs of the tokens whose text it shows
        shown += c.choices[0].delta.content or ""
        listed += [item.token for item in c.choices[0].logprobs.content]
        assert spelled(listed).startswith(shown)  # (not yet shown: a character still in pieces)


def test_logprobs_zero_and_no_top_logprobs_give_the_chosen_token_alone(client) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0, logprobs=0)
    lp = out.choices[0].logprobs
    assert [list(top) for top in lp.top_logprobs] == [[t] for t in lp.tokens]
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True)
    assert all(c.top_logprobs == [] for c in chat.choices[0].logprobs.content)


def test_every_answer_of_n_and_of_a_prompt_batch_has_its_own_logprobs(client) -> None:
    prompts = TEST_PROMPTS[:2]
    out = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0.9, seed=5,
                                    logprobs=1, extra_body={"ignore_eos": True})
    assert len(out.choices) == 4
    for choice in out.choices:
        assert len(choice.logprobs.tokens) >= 1
        check_spelling(choice.logprobs.tokens, choice.logprobs.text_offset, choice.text)
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    streamed = list(client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0.9,
                                              seed=5, logprobs=1, stream=True, extra_body={"ignore_eos": True}))
    for choice in out.choices:
        pieces = [c.choices[0] for c in streamed if c.choices and c.choices[0].index == choice.index]
        assert [t for p in pieces for t in p.logprobs.tokens] == choice.logprobs.tokens
        assert [o for p in pieces for o in p.logprobs.text_offset] == choice.logprobs.text_offset


def test_a_stop_string_ends_the_logprobs_where_it_ends_the_text(client) -> None:
    """Stop at the text of a whole token: the answer's logprobs are those of the tokens before
    it, and spell the answer; the stop string's own token is not listed."""
    prompt = TEST_PROMPTS[2]
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, logprobs=0,
                                     extra_body={"ignore_eos": True})
    tokens, text = full.choices[0].logprobs.tokens, full.choices[0].text
    starts = full.choices[0].logprobs.text_offset
    found = [i for i in range(2, len(tokens)) if len(tokens[i]) >= 2 and tokens[i].isascii()
             and text.find(tokens[i]) == starts[i]]
    if not found:
        pytest.skip("no ASCII token whose text first appears where it stands")
    i = found[0]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, logprobs=0,
                                    stop=[tokens[i]], extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert (choice.text, choice.finish_reason) == (text[: starts[i]], "stop")
    assert choice.logprobs.tokens == tokens[:i] and "".join(choice.logprobs.tokens) == choice.text
    assert choice.logprobs.token_logprobs == full.choices[0].logprobs.token_logprobs[:i]


def test_logprobs_5_lists_5_distinct_alternatives_at_every_step_special_tokens_by_their_text(client) -> None:
    """Issue 43: special tokens were all named ``""`` (the text skips them), and so were the
    pieces of a character (or ``"\ufffd"``, alike too), so they collided as keys of
    ``top_logprobs`` and ``logprobs: 5`` listed fewer than 5. Now each token has a name of its
    own: 5 keys at every step (6 when the chosen token is not among the 5), a special token
    under its literal text, as the chosen token too."""
    ref = offline_answer(SPECIAL_PROMPT, 24, 5)
    ids = {name: i for i, name in enumerate(SPECIALS)}
    assert {"<|endoftext|>", "<|im_start|>"} <= {n for n, i in ids.items() if i in ref.token_ids}, \
        "the tiny checkpoint no longer samples special tokens for this prompt: choose another"
    out = client.completions.create(model=MODEL, prompt=SPECIAL_PROMPT, max_tokens=24, temperature=0, logprobs=5,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert [len(top) for top in lp.top_logprobs] == [5] * 24  # greedy: the chosen token is the likeliest
    for token, token_id, top, entry in zip(lp.tokens, ref.token_ids, lp.top_logprobs, ref.logprobs):
        if token_id in SPECIALS.values():
            assert token == list(SPECIALS)[token_id], "a special token by its literal text"
        specials_in_top = sorted(SPECIALS[n] for n in top if n in SPECIALS)
        assert specials_in_top == sorted(t for t, _ in entry.top if t in SPECIALS.values())
        assert all(n and "\ufffd" not in n for n in top)
    assert any(n in SPECIALS for top in lp.top_logprobs for n in top), "special tokens among the alternatives"
    check_spelling(lp.tokens, lp.text_offset, out.choices[0].text)

    # Sampled: 6 keys exactly where the chosen token is not among the likeliest 5 (and then the least likely).
    sampled = client.completions.create(model=MODEL, prompt=[SPECIAL_PROMPT, "<|im_end|>\n<|im_start|>"], n=2,
                                        max_tokens=16, temperature=1.5, seed=3, logprobs=5,
                                        extra_body={"ignore_eos": True})
    counts = []
    for choice in sampled.choices:
        for token, logprob, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs,
                                       choice.logprobs.top_logprobs):
            assert top[token] == logprob and len(top) in (5, 6)
            assert len(top) == 5 or logprob <= min(top.values())
            counts.append(len(top))
        check_spelling(choice.logprobs.tokens, choice.logprobs.text_offset, choice.text)
    assert 5 in counts and 6 in counts


def test_chat_top_logprobs_5_names_5_distinct_tokens_at_every_step(client) -> None:
    messages = [{"role": "user", "content": SPECIAL_PROMPT}]
    ref = offline_answer(messages, 24, 5)
    assert {0, 1} <= set(ref.token_ids), "the tiny checkpoint no longer samples special tokens here"
    kw = dict(model=MODEL, messages=messages, max_tokens=24, temperature=0, logprobs=True, top_logprobs=5,
              extra_body={"ignore_eos": True})
    content = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == 24
    for item, token_id in zip(content, ref.token_ids):
        names = [t.token for t in item.top_logprobs]
        assert len(set(names)) == 5 and names[0] == item.token and all(n and "\ufffd" not in n for n in names)
        if token_id in SPECIALS.values():
            assert item.token == list(SPECIALS)[token_id] and bytes(item.bytes) == chat_bytes(item.token)
    assert {"<|endoftext|>", "<|im_start|>"} <= {item.token for item in content}
    streamed = [item for c in client.chat.completions.create(**kw, stream=True) if c.choices
                for item in c.choices[0].logprobs.content]
    assert [item.model_dump() for item in streamed] == [item.model_dump() for item in content]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "Hello", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "Hello", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "Hello", "logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": 3}, "logprobs"),
])
def test_out_of_range_logprobs_are_400s_naming_the_parameter(server, path: str, body: dict, param: str) -> None:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
