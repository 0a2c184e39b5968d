"""Lesson 11: lesson 10's server serves a mixture-of-experts checkpoint unchanged.

Run: pytest lessons/l11

``python -m minisgl --model <qwen3-moe checkpoint>`` on the CPU, asked through the official
``openai`` client (completions, a batch of prompts and a stream, and a chat), answers with the
same greedy text as the offline ``LLM`` on the same checkpoint (itself identical to Hugging
Face, see ``test_l11_engine.py``). Nothing in the server knows that the model has experts: the
builder gives the model lesson 11's layers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from minisgl import LLM, SamplingParams
from minisgl.testing import TEST_PROMPTS, tiny_checkpoint
from minisgl.testing.server import ServerProcess

MAX_TOKENS = 16
CHAT = [{"role": "user", "content": "Which experts does a token use?"}]


@pytest.fixture(scope="module")
def served():
    """The server, started while the offline ``LLM`` answers the same requests in this process:
    ``(server, {prompt: text}, chat prompt ids, chat text)``."""
    path = tiny_checkpoint("qwen3_moe")
    server = ServerProcess(path, "--page-size", "4", start_timeout=300, stop_timeout=60)  # (l10 times the stop)
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(server.__enter__)
        llm = LLM(path, page_size=4)
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        texts = {p: o.text for p, o in zip(TEST_PROMPTS, llm.generate(list(TEST_PROMPTS), params, progress=False))}
        chat_ids = llm.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
        chat_ids = list(chat_ids["input_ids"] if hasattr(chat_ids, "keys") else chat_ids)
        chat_text = llm.generate([chat_ids], params, progress=False)[0].text
        started.result()
    try:
        yield server, texts, chat_text
    finally:
        server.stop()


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_completions_are_the_offline_llms_text(served) -> None:
    server, texts, _ = served
    c, model = client(server), str(tiny_checkpoint("qwen3_moe"))
    assert [m.id for m in c.models.list().data] == [model]
    out = c.completions.create(model=model, prompt=list(TEST_PROMPTS), max_tokens=MAX_TOKENS, temperature=0)
    got = {TEST_PROMPTS[choice.index]: choice.text for choice in out.choices}
    assert got == texts
    assert len(set(texts.values())) == len(texts), "different prompts, different answers"
    stream = c.completions.create(model=model, prompt=TEST_PROMPTS[3], max_tokens=MAX_TOKENS, temperature=0,
                                  stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == texts[TEST_PROMPTS[3]]


def test_chat_is_the_offline_llms_text(served) -> None:
    server, _, chat_text = served
    out = client(server).chat.completions.create(model=str(tiny_checkpoint("qwen3_moe")), messages=CHAT,
                                                 max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].message.content == chat_text
