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
    ("min_tokens", 4), ("min_p", 0.05), ("skip_special_tokens", False),
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


def test_repetition_penalty_only_at_its_unused_value() -> None:
    """vLLM's ``bench serve`` client sends ``repetition_penalty: 1.0`` (no penalty) with every
    completion: accepted at 1, refused naming it at any other value (the engine has none)."""
    assert parse_completion({**COMPLETION, "repetition_penalty": 1.0}, "m").params["max_tokens"] == 16
    for parse, body in ((parse_chat, CHAT), (parse_completion, COMPLETION)):
        with pytest.raises(APIError, match="repetition_penalty is not supported") as caught:
            parse({**body, "repetition_penalty": 1.1}, "m")
        assert caught.value.status == 400 and caught.value.param == "repetition_penalty"
    with pytest.raises(APIError, match="'repetition_penalty'.*does not implement"):  # nor in SGLang's sampling_params
        parse_generate({"text": "Hello", "sampling_params": {"repetition_penalty": 1.0}})


def test_several_unknown_parameters_are_all_named() -> None:
    with pytest.raises(APIError, match="unknown parameters 'min_p', 'regex'"):
        parse_completion({**COMPLETION, "regex": "a", "min_p": 0.1}, "m")


def test_logprobs_map_to_sampling_params_and_out_of_range_is_refused() -> None:
    """``logprobs: 0`` asks a completion for the sampled token's log-probability (not "off");
    chat asks with ``logprobs: true`` and names the alternatives with ``top_logprobs``."""
    assert parse_completion({**COMPLETION, "logprobs": 0}, "m").params["logprobs"] == 0
    assert parse_completion({**COMPLETION, "logprobs": 20}, "m").params["logprobs"] == 20
    assert parse_completion(COMPLETION, "m").params["logprobs"] is None
    assert parse_chat({**CHAT, "logprobs": True, "top_logprobs": 3}, "m").params["logprobs"] == 3
    assert parse_chat({**CHAT, "logprobs": True}, "m").params["logprobs"] == 0
    assert parse_chat({**CHAT, "logprobs": False}, "m").params["logprobs"] is None
    assert parse_generate({"text": "Hi"}).params["logprobs"] is None  # SGLang's native API: not offered
    for call, name in [(lambda: parse_completion({**COMPLETION, "logprobs": 21}, "m"), "logprobs"),
                       (lambda: parse_chat({**CHAT, "logprobs": True, "top_logprobs": 21}, "m"), "top_logprobs"),
                       (lambda: parse_chat({**CHAT, "top_logprobs": 1}, "m"), "top_logprobs")]:
        with pytest.raises(APIError) as caught:
            call()
        assert caught.value.status == 400 and caught.value.param == name and name in caught.value.message


def test_unknown_stream_options_are_refused() -> None:
    with pytest.raises(APIError, match="'continuous_usage_stats'"):
        parse_chat({**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
                   "m")


def test_implemented_parameters_and_not_used_values_still_pass() -> None:
    chat = parse_chat({**CHAT, "model": "m", "max_completion_tokens": 5, "temperature": 0, "top_p": 0.9, "top_k": 3,
                       "seed": 7, "stop": ["x"], "stop_token_ids": [1], "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, "n": 1, "logprobs": False, "top_logprobs": 0}, "m")
    assert chat.params["max_tokens"] == 5 and chat.params["top_k"] == 3 and chat.include_usage
    assert chat.params["logprobs"] is None  # logprobs=false: top_logprobs=0 is its "not used" value
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


def test_n_and_prompt_batches_parse_into_one_engine_request_per_answer() -> None:
    batch = parse_completion({"prompt": ["Hello", "Hi"], "n": 2, "seed": 2**63 - 1, "temperature": 1}, "m")
    calls = batch.calls()
    assert [c.prompt for c in calls] == ["Hello", "Hello", "Hi", "Hi"]
    assert [c.rid for c in calls] == [f"{batch.rid}-{i}" for i in range(4)]
    # answer j of a prompt samples with seed + j, wrapped into int64: the answers differ, and repeat
    assert [c.params["seed"] for c in calls] == [2**63 - 1, -(2**63), 2**63 - 1, -(2**63)]
    ids = parse_completion({"prompt": [[1, 2], [3]]}, "m")
    assert [c.prompt for c in ids.calls()] == [[1, 2], [3]]
    one = parse_completion({"prompt": [1, 2]}, "m")  # a list of ints is one prompt of token ids
    assert [c.prompt for c in one.calls()] == [[1, 2]] and one.calls()[0].rid == one.rid
    for bad, param in [({"prompt": ["Hi", [1]]}, "prompt"), ({"prompt": ["Hi", ""]}, "prompt"),
                       ({"prompt": ["Hi"] * 65}, "prompt"), ({"prompt": ["Hi"] * 8, "n": 9}, "n"),
                       ({"prompt": "Hi", "n": 0}, "n"), ({"prompt": "Hi", "n": True}, "n")]:
        with pytest.raises(APIError) as caught:
            parse_completion(bad, "m")
        assert caught.value.status == 400 and caught.value.param == param, bad
    assert len(parse_chat({**CHAT, "n": 3}, "m").calls()) == 3


def test_n_answers_and_prompt_batches_through_the_openai_client(server) -> None:
    """``n`` answers per prompt and a batch of prompts: one choice each, in order, as a client
    of OpenAI's API expects them, streamed or not, reproducible with a seed."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=120)
    model = client.models.list().data[0].id
    sampled = dict(model=model, max_tokens=6, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    out = client.completions.create(prompt="Hello", n=3, **sampled)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.text for c in out.choices]
    assert len(set(texts)) > 1, f"three sampled answers with seeds 11, 12, 13 came out equal: {texts}"
    assert out.usage.completion_tokens == 18
    assert out.usage.prompt_tokens == client.completions.create(prompt="Hello", **sampled).usage.prompt_tokens
    again = client.completions.create(prompt="Hello", n=3, **sampled)
    assert [c.text for c in again.choices] == texts, "a seed makes the whole response reproducible"
    # streamed: each event names its choice; the pieces of each index make that choice's answer
    pieces: dict[int, str] = {}
    for chunk in client.completions.create(prompt="Hello", n=3, stream=True, **sampled):
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + choice.text
    assert [pieces[i] for i in range(3)] == texts
    # a batch of prompts, greedy: each choice is what that prompt alone answers
    prompts = ["Hello", "The cat", "Once upon"]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=5, temperature=0).choices[0].text
             for p in prompts]
    batch = client.completions.create(model=model, prompt=prompts, max_tokens=5, temperature=0)
    assert [c.text for c in batch.choices] == alone
    # chat, n=2, streamed: a role in each choice's first delta
    roles, content = {}, {}
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=2,
                                                max_tokens=4, temperature=1.0, seed=5, stream=True):
        for choice in chunk.choices:
            roles.setdefault(choice.index, choice.delta.role)
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
    assert roles == {0: "assistant", 1: "assistant"} and set(content) == {0, 1}


def test_tokenize_and_detokenize_agree_with_what_the_engine_counts(server) -> None:
    """``/tokenize`` gives the ids a request starts from (its count is the request's
    ``prompt_tokens``), for a prompt and for a chat; ``/detokenize`` turns ids back into text."""
    text = "The quick brown fox"
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=60)
    assert r.status_code == 200, r.text
    ids, count = r.json()["tokens"], r.json()["count"]
    done = httpx.post(f"{server.url}/v1/completions", json={"prompt": text, "max_tokens": 1}, timeout=60).json()
    assert count == len(ids) == done["usage"]["prompt_tokens"]
    assert r.json()["max_model_len"] == ModelConfig.from_dir(tiny_checkpoint("qwen3")).max_position_embeddings
    chat = httpx.post(f"{server.url}/tokenize", json=CHAT, timeout=60).json()
    answered = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "max_tokens": 1}, timeout=60).json()
    assert chat["count"] == answered["usage"]["prompt_tokens"]
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=60)
    assert back.status_code == 200 and back.json()["prompt"] == text
    for path, body, param in [("/detokenize", {"tokens": [10**6]}, "tokens"), ("/detokenize", {"tokens": "ab"}, "tokens"),
                              ("/tokenize", {"prompt": text, "messages": CHAT["messages"]}, "prompt"),
                              ("/tokenize", {"prompt": text, "add_special_tokens": False}, "add_special_tokens"),
                              ("/tokenize", {"prompt": text, "truncate": 3}, "truncate")]:
        bad = httpx.post(f"{server.url}{path}", json=body, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (path, body, bad.text)


def test_a_stalled_streams_queue_stays_bounded_and_its_answer_exact() -> None:
    """A client that stops reading: its chunks past MAX_PENDING_CHUNKS merge into the last one
    waiting, so the queue holds at most that many objects and the answer loses nothing."""
    import asyncio

    from minisgl.server import api
    from minisgl.server.messages import TextChunk

    async def fill_and_drain() -> list[TextChunk]:
        queue = api.ChunkQueue()
        n = api.MAX_PENDING_CHUNKS + 1000
        for i in range(n):
            queue.put_nowait(TextChunk("r", f"{i},", [i], "length" if i == n - 1 else None, 3, i + 1))
        assert queue.qsize() == api.MAX_PENDING_CHUNKS
        queue.put_nowait(TextChunk("r", "", [], "error", error="stopping", status=503))  # never merged
        return [queue.get_nowait() for _ in range(queue.qsize())]

    chunks = asyncio.run(fill_and_drain())
    n = api.MAX_PENDING_CHUNKS + 1000
    assert "".join(c.text for c in chunks) == "".join(f"{i}," for i in range(n))
    assert [t for c in chunks for t in c.token_ids] == list(range(n))
    assert (chunks[-2].finish_reason, chunks[-2].completion_tokens) == ("length", n)
    assert chunks[-1].error == "stopping" and len(chunks) == api.MAX_PENDING_CHUNKS + 1


def test_a_refused_answer_aborts_the_others_of_its_streamed_request(server) -> None:
    """A batch of two streamed prompts, the second refused before its first token (a token id
    outside the vocabulary): the 400 comes back, and the first answer, already running, is
    aborted at once (its KV freed), not left to generate its 1,500 tokens for nobody."""
    from tests.tools.load import ABORTED, parse_metrics

    def aborted() -> float:
        return parse_metrics(httpx.get(f"{server.url}/metrics", timeout=30).text).get(ABORTED, 0.0)

    before = aborted()
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": [[5, 6, 7], [10**9]], "max_tokens": 1500, "ignore_eos": True, "stream": True})
    assert r.status_code == 400, r.text
    assert aborted() == before + 1, "the running answer was not aborted"


def test_parse_metrics_keys_every_sample_as_the_page_writes_it() -> None:
    """``parse_metrics`` (prometheus-client's parser) gives each sample under the text the page
    writes before its value, escaped label values included, and its value as a float."""
    from minisgl.server.messages import Stats
    from minisgl.server.metrics import ServerMetrics, parse_metrics

    metrics = ServerMetrics()
    metrics.on_finish("r", "abort", 5, 3, 2, 0.0)
    metrics.requests.labels(finish_reason='odd "one"\\\n').inc(2)
    metrics.set_engine_stats(Stats(running=1, waiting=2, num_pages=10, free_pages=6, cached_pages=1,
                                   prefix_hit_tokens=1, prefix_query_tokens=4))
    page = metrics.render().decode()
    values = parse_metrics(page)
    lines = [line for line in page.splitlines() if line and not line.startswith("#")]
    assert len(values) == len(lines)
    for line in lines:
        key, _, value = line.rpartition(" ")
        assert values[key] == float(value), line
    assert values['minisgl_requests_total{finish_reason="abort"}'] == 1.0
    assert values['minisgl_requests_total{finish_reason="odd \\"one\\"\\\\\\n"}'] == 2.0
    assert values["minisgl_kv_pages_used"] == 3.0
    assert values['minisgl_e2e_request_latency_seconds_bucket{le="+Inf"}'] == 1.0


def test_openapi_names_the_response_models_and_real_responses_fit_them(server) -> None:
    """Each operation's 200 and 4xx bodies in ``/openapi.json`` are the models of
    ``protocol``, and a real (not streamed) answer of each endpoint validates against its model,
    with logprobs asked, as does an error body."""
    from minisgl.server import protocol as p

    document = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    url, name = server.url, httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
    calls = [("post", "/v1/completions", p.CompletionResponse, {**COMPLETION, "max_tokens": 3, "logprobs": 2}),
             ("post", "/v1/chat/completions", p.ChatResponse,
              {**CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 2}),
             ("post", "/generate", p.GenerateResponse, {"text": "Hi", "sampling_params": {"max_new_tokens": 3}}),
             ("get", "/v1/models", p.ModelList, None), ("get", "/v1/models/{model_id}", p.ModelCard, None),
             ("post", "/tokenize", p.TokenizeResponse, {"prompt": "Hello there"}),
             ("post", "/detokenize", p.DetokenizeResponse, {"tokens": [1, 2, 3]})]
    for method, path, model, body in calls:
        answers = document["paths"][path][method]["responses"]
        assert answers["200"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model.__name__}"}
        assert answers["4XX"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
        assert model.__name__ in document["components"]["schemas"]
        r = httpx.request(method, url + path.replace("{model_id}", name), json=body, timeout=60)
        assert r.status_code == 200, r.text
        model.model_validate(r.json())
    for r in (httpx.get(f"{url}/v1/models/someone/else", timeout=30),
              httpx.post(f"{url}/v1/completions", json={**COMPLETION, "top_p": 2}, timeout=30)):
        assert r.status_code in (400, 404), r.text
        p.ErrorResponse.model_validate(r.json())
    assert p.CompletionResponse.model_validate(httpx.post(f"{url}/v1/completions", json={
        **COMPLETION, "max_tokens": 3, "logprobs": 2}, timeout=60).json()).choices[0].logprobs is not None
