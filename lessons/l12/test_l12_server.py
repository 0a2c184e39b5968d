"""Lesson 12: ``python -m minisgl --speculative ngram`` (or ``draft``) serves the target's greedy text.

Run: pytest lessons/l12

A real server process on a local port, with prompt lookup on (or a draft model: ``--speculative
draft --draft-model PATH``), talked to through the official
``openai`` client: streamed or not, every answer is Hugging Face's greedy text for the same
checkpoint (what the server gives without speculation, lesson 10), streaming still sends one
chunk per token although a step may add several, ``/metrics`` shows the acceptance histogram,
and no KV page stays held once the requests are done.
"""

from __future__ import annotations

import openai
import pytest

from minisgl.testing import HFReference, draft_checkpoint, tiny_checkpoint
from minisgl.testing.server import ServerProcess, wait_until_idle
from minisgl.tokenizer import load_tokenizer

ARCH = "qwen3"
SPEC_STD = 0.12  # the lesson's test models (see test_l12_engine.py)
PROMPTS = [[57, 301, 12] * 4, [400, 9, 77, 130, 9] * 3, [88, 88, 205, 17] * 3 + [300], [31, 44, 52, 61, 70, 85, 99]]


def checkpoint():
    return tiny_checkpoint(ARCH, std=SPEC_STD)


@pytest.fixture(scope="module", params=["ngram", "draft"])
def server(request):
    # (How fast SIGTERM stops it is lesson 10's test; on a busy machine it may take over 5 s.)
    proposer = ["--speculative", request.param]
    if request.param == "draft":  # the test draft: the checkpoint with a little noise on its weights
        proposer += ["--draft-model", str(draft_checkpoint(checkpoint()))]
    with ServerProcess(checkpoint(), *proposer, "--num-speculative-tokens", "4", "--page-size", "4",
                       start_timeout=180, stop_timeout=30) as s:
        yield s


def hf_answer(prompt: list[int], n: int) -> tuple[list[int], str]:
    tok = load_tokenizer(checkpoint())
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    ids = HFReference(checkpoint()).greedy(prompt, n, stop_token_ids=eos)
    return ids, tok.decode(ids, skip_special_tokens=True)


def test_openai_client_gets_the_targets_greedy_text(server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    model = str(checkpoint())
    for prompt in PROMPTS:
        ids, text = hf_answer(prompt, 40)
        out = client.completions.create(model=model, prompt=prompt, max_tokens=40, temperature=0)
        assert out.choices[0].text == text
        assert out.usage.completion_tokens == len(ids)
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=40, temperature=0, stream=True)
        pieces = [c.choices[0].text for c in stream if c.choices]
        assert "".join(pieces) == text
        assert len(pieces) == len(ids), "one SSE chunk per generated token, however many a step adds"
    metrics = wait_until_idle(server.url)
    rows = metrics["minisgl_spec_accepted_tokens_count"]
    accepted = metrics["minisgl_spec_accepted_tokens_sum"]
    assert rows > 0 and accepted > 0, "drafts must have been verified and accepted"
    several = rows - metrics['minisgl_spec_accepted_tokens_bucket{le="1"}']
    assert several > 0, "some verify steps must accept two or more drafts"
    assert metrics['minisgl_spec_accepted_tokens_bucket{le="+Inf"}'] == rows
    assert metrics["minisgl_kv_pages_used"] == 0
