"""Every request parameter is implemented or refused with a 400 that names it; none is accepted
and ignored. And a body that is not JSON by its Content-Type gets a 415.

The refused parameters below are those that other servers' clients send (vLLM's and SGLang's
extensions, OpenAI features this server does not have); each used to be answered 200 while
changing nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from minisgl.config import ModelConfig
from minisgl.server.protocol import APIError, parse_chat, parse_completion, parse_generate
from minisgl.testing import tiny_checkpoint
from minisgl.testing.server import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"prompt": "Hello"}

IGNORED_BEFORE = [
    ("min_tokens", 4), ("repetition_penalty", 1.1), ("min_p", 0.05), ("skip_special_tokens", False),
    ("regex", "[a-z]+"), ("json_schema", {"type": "object"}), ("ebnf", "root ::= 'a'"),
    ("structured_outputs", {"regex": "("}), ("use_beam_search", True), ("truncate_prompt_tokens", 8),
    ("prompt_logprobs", 1), ("user", "someone"),
]


@pytest.mark.parametrize("name, value", IGNORED_BEFORE, ids=[n for n, _ in IGNORED_BEFORE])
@pytest.mark.parametrize("endpoint", ["chat", "completion", "generate"])
def test_an_unimplemented_parameter_is_a_400_that_names_it(endpoint: str, name: str, value) -> None:
    if endpoint == "chat":
        call = lambda: parse_chat({**CHAT, name: value}, "m")  # noqa: E731
    elif endpoint == "completion":
        call = lambda: parse_completion({**COMPLETION, name: value}, "m")  # noqa: E731
    else:  # SGLang's native API: extensions go inside sampling_params
        call = lambda: parse_generate({"text": "Hello", "sampling_params": {name: value}})  # noqa: E731
    with pytest.raises(APIError) as caught:
        call()
    assert caught.value.status == 400 and caught.value.param == name
    assert repr(name) in caught.value.message and "does not implement" in caught.value.message


def test_several_unknown_parameters_are_all_named() -> None:
    with pytest.raises(APIError, match="unknown parameters 'min_p', 'regex'"):
        parse_completion({**COMPLETION, "regex": "a", "min_p": 0.1}, "m")


def test_logprobs_zero_and_unknown_stream_options_are_refused() -> None:
    """``logprobs: 0`` asks a completion for the sampled token's log-probability: not implemented."""
    with pytest.raises(APIError, match="logprobs is not supported"):
        parse_completion({**COMPLETION, "logprobs": 0}, "m")
    with pytest.raises(APIError, match="'continuous_usage_stats'"):
        parse_chat({**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
                   "m")


def test_implemented_parameters_and_not_used_values_still_pass() -> None:
    chat = parse_chat({**CHAT, "model": "m", "max_completion_tokens": 5, "temperature": 0, "top_p": 0.9, "top_k": 3,
                       "seed": 7, "stop": ["x"], "stop_token_ids": [1], "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, "n": 1, "logprobs": False, "top_logprobs": 0}, "m")
    assert chat.params["max_tokens"] == 5 and chat.params["top_k"] == 3 and chat.include_usage
    gen = parse_generate({"text": "Hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0}, "stream": False})
    assert gen.params["max_tokens"] == 3


@pytest.fixture(scope="module")
def server():
    with ServerProcess(tiny_checkpoint("qwen3")) as s:
        yield s


def test_through_the_server_form_bodies_get_415_and_unknown_fields_400(server) -> None:
    body = json.dumps({**COMPLETION, "max_tokens": 2})
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=30)
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={**COMPLETION, "max_tokens": 2, "min_tokens": 2}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text
    # the same request without the extension, and a JSON body without a Content-Type, are served
    r = httpx.post(f"{server.url}/v1/completions", json={**COMPLETION, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=30)
    assert r.status_code == 200, r.text


def test_models_list_their_context_and_answer_by_id(server) -> None:
    """What clients ask before a run: ``max_model_len`` and ``GET /v1/models/{id}`` (a 404 for
    another model, naming the one served)."""
    listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    context = ModelConfig.from_dir(tiny_checkpoint("qwen3")).max_position_embeddings
    assert len(listed) == 1 and listed[0]["max_model_len"] == context, listed
    name = listed[0]["id"]
    one = httpx.get(f"{server.url}/v1/models/{name}", timeout=30)
    assert one.status_code == 200 and one.json() == listed[0]
    other = httpx.get(f"{server.url}/v1/models/someone/else", timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert repr(name) in other.json()["error"]["message"]


def test_any_int64_is_a_seed_and_a_negative_one_samples_reproducibly(server) -> None:
    body = {**COMPLETION, "max_tokens": 6, "temperature": 1.0, "seed": -(2**63), "ignore_eos": True}
    first = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    again = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert first.status_code == 200 and first.json()["choices"][0]["text"] == again.json()["choices"][0]["text"]
    too_small = httpx.post(f"{server.url}/v1/completions", json={**body, "seed": -(2**63) - 1}, timeout=30)
    assert too_small.status_code == 400 and too_small.json()["error"]["param"] == "seed"
