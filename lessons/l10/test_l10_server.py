"""Lesson 10: the OpenAI-compatible server, tested as a user meets it.

Run: pytest lessons/l10

Every test talks to ``python -m minisgl`` started as a real process (API server, tokenizer
worker, scheduler) on a real port of 127.0.0.1, mostly through the official ``openai`` client,
unmodified. Greedy outputs must equal Hugging Face's on the same tiny checkpoint, token for
token and character for character, streamed or not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from minisgl.detokenizer import StopStringFilter
from minisgl.testing import TEST_PROMPTS, HFReference, tiny_checkpoint
from minisgl.testing.server import ServerProcess, wait_until_idle
from minisgl.tokenizer import load_tokenizer

ARCH = "qwen3"
START_S = 300  # for each server started together: on a busy 2-core machine they queue for the cores
CHAT = [{"role": "system", "content": "You are a tiny model."}, {"role": "user", "content": "What does a radix tree remember?"}]


class StartedTogether:
    """Every server process this module needs, started at once (each start is a chain of one
    busy process at a time: the launcher, then the scheduler beside the tokenizer worker, so
    several chains fill two cores far better than one after another). Each test then takes its
    own server, already up, and still stops it itself where it checks the stopping. Started
    before the first test, and every start finished before any test runs, so no test shares
    the cores with a start-up."""

    def __init__(self, servers: dict[str, ServerProcess], commands: dict[str, list[str]],
                 in_process: dict[str, contextlib.AbstractContextManager]) -> None:
        self.servers, self.in_process = servers, in_process
        self.commands = {name: subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True) for name, cmd in commands.items()}
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            self.started = {name: pool.submit(s.__enter__) for name, s in {**servers, **in_process}.items()}
        concurrent.futures.wait(self.started.values())

    def server(self, name: str) -> ServerProcess:
        return self.started[name].result()  # the start-up's own error, if it failed

    @contextlib.contextmanager
    def take(self, name: str):
        """``with together.take(name) as s:`` as ``with ServerProcess(...) as s:``, started already."""
        s = self.server(name)
        try:
            yield s
        finally:
            s.stop()

    def command(self, name: str, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
        """A ``python -m minisgl ...`` started with the servers: its input, then its exit and output."""
        proc = self.commands[name]
        out, err = proc.communicate(stdin, timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def close(self) -> None:
        for proc in self.commands.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        for name, future in self.started.items():
            if future.exception() is not None:
                continue
            if name in self.in_process:
                self.in_process[name].__exit__(None, None, None)
            elif self.servers[name].proc.poll() is None:
                self.servers[name].stop()


def two_eos_ids(tok) -> dict[str, int]:
    """Prompts and, for each, the 4th token of its greedy output: two different tokens, each
    absent from its output before that. As EOS ids, each must stop its prompt after 4 tokens."""
    ref = HFReference(tiny_checkpoint(ARCH))
    outs = {p: ref.greedy(tok.encode(p), 12) for p in TEST_PROMPTS[:3]}
    chosen: dict[str, int] = {}
    for p, ids in outs.items():
        if ids[3] not in ids[:3] and ids[3] not in chosen.values() and len(chosen) < 2:
            chosen[p] = ids[3]
    return chosen


@pytest.fixture(scope="module")
def together(tok, tmp_path_factory):
    tiny = tiny_checkpoint(ARCH)
    servers = {
        "main": ServerProcess(tiny, "--page-size", "4", start_timeout=START_S),
        "api_key": ServerProcess(tiny, api_key="s3cret", start_timeout=START_S),
        "SIGINT": ServerProcess(tiny, start_timeout=START_S),  # (SIGTERM stops "main", after every test that uses it)
        "child_dies": ServerProcess(tiny, start_timeout=START_S),
        "tp": ServerProcess(tiny, "--tp-size", "2", "--page-size", "4", start_timeout=START_S),
    }
    chosen = two_eos_ids(tok)
    if len(chosen) == 2:
        ckpt = tmp_path_factory.mktemp("two_eos") / "two_eos"
        shutil.copytree(tiny, ckpt)
        gen = json.loads((ckpt / "generation_config.json").read_text())
        gen["eos_token_id"] = list(chosen.values())
        (ckpt / "generation_config.json").write_text(json.dumps(gen))
        servers["two_eos"] = ServerProcess(ckpt, start_timeout=START_S)
    minisgl = [sys.executable, "-m", "minisgl", "--device", "cpu"]
    commands = {
        "shell": minisgl + ["--model", str(tiny), "--shell"],
        # valid as a flag, but no KV page fits in 64 bytes: the scheduler child fails while it starts
        "tiny_kv_budget": minisgl + ["--model", str(tiny), "--cpu-kv-bytes", "64"],
        "bad_page_size": minisgl + ["--model", str(tiny), "--page-size", "0"],
        "no_checkpoint": [sys.executable, "-m", "minisgl", "--model", "/no/such/checkpoint"],
    }
    # The teeth test's server runs in this process (its handlers get patched, when the test runs).
    from minisgl.server.launcher import ServerArgs, serve_in_thread

    in_process = {"teeth": serve_in_thread(ServerArgs(str(tiny), port=0, llm=dict(device="cpu")))}
    started = StartedTogether(servers, commands, in_process)
    yield started
    started.close()


@pytest.fixture(scope="module")
def server(together):
    """The server most tests share. ``test_signals_stop_everything_cleanly[SIGTERM]`` stops it,
    so every test that uses it comes before that one in this file."""
    return together.server("main")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_checkpoint(ARCH))


def hf_answer(tok, prompt_ids: list[int], n: int) -> tuple[list[int], str]:
    """HF's greedy tokens (stopping at the model's EOS ids, the stop included) and their text."""
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    ids = HFReference(tiny_checkpoint(ARCH)).greedy(prompt_ids, n, stop_token_ids=eos)
    return ids, tok.decode(ids, skip_special_tokens=True)


def child_environ(pid: int) -> dict[str, str]:
    """The environment a process started with (Linux)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [item.decode(errors="replace").partition("=") for item in f.read().split(b"\0") if item]
    return {k: v for k, _, v in items}


def streamed(chunks) -> tuple[str, list[str], list[str | None], object]:
    """Text, per-chunk pieces, per-chunk finish reasons and the usage of a completions stream."""
    pieces, reasons, use = [], [], None
    for c in chunks:
        if c.usage is not None:
            use = c.usage
        for choice in c.choices:
            pieces.append(choice.text if hasattr(choice, "text") else (choice.delta.content or ""))
            reasons.append(choice.finish_reason)
    return "".join(pieces), pieces, reasons, use


# --- the API as the openai client sees it ------------------------------------------------------
def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [str(tiny_checkpoint(ARCH))]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


@pytest.mark.parametrize("prompt", TEST_PROMPTS)
def test_completions_match_hf_streamed_or_not(client, tok, prompt):
    ids, text = hf_answer(tok, tok.encode(prompt), 12)
    out = client.completions.create(model=str(tiny_checkpoint(ARCH)), prompt=prompt, max_tokens=12, temperature=0)
    assert out.choices[0].text == text
    assert out.usage.completion_tokens == len(ids) and out.usage.prompt_tokens == len(tok.encode(prompt))
    assert out.choices[0].finish_reason == ("stop" if len(ids) < 12 else "length")
    s_text, pieces, reasons, _ = streamed(client.completions.create(
        model=str(tiny_checkpoint(ARCH)), prompt=prompt, max_tokens=12, temperature=0, stream=True))
    assert s_text == text
    assert len(pieces) == len(ids), "one SSE chunk per generated token"
    assert reasons[:-1] == [None] * (len(reasons) - 1) and reasons[-1] == out.choices[0].finish_reason


def test_chat_matches_hf_streamed_or_not(client, tok):
    prompt_ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    prompt_ids = prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else list(prompt_ids)
    ids, text = hf_answer(tok, prompt_ids, 10)
    out = client.chat.completions.create(model=str(tiny_checkpoint(ARCH)), messages=CHAT, max_completion_tokens=10,
                                         temperature=0)
    assert out.choices[0].message.content == text and out.choices[0].message.role == "assistant"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt_ids), len(ids))
    chunks = list(client.chat.completions.create(model=str(tiny_checkpoint(ARCH)), messages=CHAT, max_tokens=10,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    s_text, pieces, _, use = streamed(chunks)
    assert s_text == text and len(pieces) == len(ids) and use is None  # no usage unless asked


def test_token_id_prompt_and_generate_endpoint(server, client, tok):
    prompt_ids = tok.encode(TEST_PROMPTS[2])
    ids, text = hf_answer(tok, prompt_ids, 8)
    out = client.completions.create(model=str(tiny_checkpoint(ARCH)), prompt=prompt_ids, max_tokens=8, temperature=0)
    assert out.choices[0].text == text
    raw = httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt_ids, "max_tokens": 8, "stream": True})
    events = [line for line in raw.text.split("\n") if line]
    assert raw.headers["content-type"].startswith("text/event-stream") and events[-1] == "data: [DONE]"
    assert len(events) == len(ids) + 1 and all(e.startswith("data: ") for e in events)
    native = httpx.post(f"{server.url}/generate", json={
        "input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    assert native["output_ids"] == ids and native["text"] == text
    # Streamed, /generate answers as SGLang's native API does: every event holds the whole
    # answer so far, so the last one is the answer (SGLang's own client keeps only the last).
    raw = httpx.post(f"{server.url}/generate", json={
        "input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "stream": True})
    events = [json.loads(line[len("data: "):]) for line in raw.text.split("\n") if line.startswith("data: {")]
    assert [e["output_ids"] for e in events] == [ids[: i + 1] for i in range(len(ids))]
    assert events[-1]["text"] == text and events[-1]["meta_info"]["finish_reason"] == "length"


def test_include_usage_and_cached_tokens(client, tok):
    long_prompt = " ".join(TEST_PROMPTS) * 2  # well over a few 4-token pages
    n = len(tok.encode(long_prompt))
    first = client.completions.create(model=str(tiny_checkpoint(ARCH)), prompt=long_prompt, max_tokens=4, temperature=0)
    chunks = list(client.completions.create(model=str(tiny_checkpoint(ARCH)), prompt=long_prompt, max_tokens=4,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    _, pieces, _, use = streamed(chunks)
    assert chunks[-1].choices == [] and use is not None, "the usage chunk comes last, with no choices"
    assert (use.prompt_tokens, use.completion_tokens) == (n, len(pieces)) == (n, first.usage.completion_tokens)
    cached = use.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0 or first.usage.prompt_tokens == n
    assert n - 4 <= cached < n, f"the repeated prompt's whole pages should come from the radix cache ({cached}/{n})"


def test_seeds_reproduce_across_requests(client):
    def sample(seed: int) -> str:
        return client.completions.create(model=str(tiny_checkpoint(ARCH)), prompt="Hello", max_tokens=16,
                                         temperature=1.0, seed=seed, extra_body={"ignore_eos": True}).choices[0].text

    assert sample(7) == sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


# --- stop strings --------------------------------------------------------------------------------
def stop_across_boundary(tok, prompt: str, n: int) -> tuple[str, str]:
    """A stop string made of the end of one generated token and the start of the next (ASCII
    letters on both sides), and the text expected before it."""
    ids = HFReference(tiny_checkpoint(ARCH)).greedy(tok.encode(prompt), n)
    pieces = [tok.decode([t]) for t in ids]
    for i in range(2, len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        if len(a) >= 2 and len(b) >= 2 and (a[-2:] + b[:2]).isascii() and (a[-2:] + b[:2]).strip() == a[-2:] + b[:2]:
            stop = a[-2:] + b[:2]
            full = tok.decode(ids)
            return stop, full[: full.index(stop)]
    pytest.skip("no ASCII token boundary in this generation")


@pytest.mark.parametrize("prompt", TEST_PROMPTS[1:4])
def test_stop_string_across_tokens_is_never_emitted(client, tok, prompt):
    stop, expected = stop_across_boundary(tok, prompt, 24)
    kw = dict(model=str(tiny_checkpoint(ARCH)), prompt=prompt, max_tokens=24, temperature=0,
              stop=[stop], extra_body={"ignore_eos": True})
    out = client.completions.create(**kw)
    assert (out.choices[0].text, out.choices[0].finish_reason) == (expected, "stop")
    text, pieces, reasons, _ = streamed(client.completions.create(**kw, stream=True))
    assert text == expected and reasons[-1] == "stop"
    assert stop[:2] not in "".join(pieces)[len(expected):], "part of the stop string reached the client"


def check_stop_filter(filter_cls, pieces: list[str], stop: str) -> str:
    """Feed ``pieces`` through ``filter_cls([stop])``; what a client would have received."""
    f = filter_cls([stop])
    return "".join(f.feed(p) for p in pieces) + f.flush()


def test_teeth_a_filter_that_emits_a_stop_prefix_is_caught():
    class NoHoldBack(StopStringFilter):  # the classic bug: only look for complete matches
        def _partial_match_len(self, text: str) -> int:
            return 0

    pieces, stop = ["The cat s", "at on the m", "at."], "sat"
    assert check_stop_filter(StopStringFilter, pieces, stop) == "The cat "
    assert check_stop_filter(NoHoldBack, pieces, stop) == "The cat sat on the mat.", (
        "without hold-back the stop string split over two pieces is never seen, and the text goes on")


def filtered(stops: list[str], pieces: list[str]) -> tuple[list[str], str, bool]:
    """What each piece lets through, what the end of the stream lets through, and whether a
    stop string ended it."""
    f = StopStringFilter(stops)
    out = [f.feed(p) for p in pieces]
    return out, f.flush(), f.stopped


def test_the_stop_filter_piece_by_piece():
    """The filter's promises, one piece at a time (no server: a quick loop for the exercise)."""
    assert filtered(["sat"], ["The cat s", "at on the m", "at."]) == (["The cat ", "", ""], "", True)  # the docstring's
    assert filtered(["sat"], ["The cat s"]) == (["The cat "], "s", False), "a held tail is text after all at the end"
    assert filtered(["cat"], ["The cat", " sat", " on"]) == (["The ", "", ""], "", True), "after a stop, nothing"
    assert filtered([], ["The ", "cat"]) == (["The ", "cat"], "", False), "no stop strings: everything at once"
    assert filtered(["xyz"], ["The cat", " sat"]) == (["The cat", " sat"], "", False), "nothing held, nothing twice"
    assert filtered(["sat"], ["The cat a", "te"]) == (["The cat a", "te"], "", False), "'a' is in 'sat' but does not begin it"
    # Several stop strings: the earliest in the text wins, whichever the list names first ...
    assert filtered(["on", "cat"], ["The cat sat on"]) == (["The "], "", True)
    # ... and the held tail is the longest that begins any of them, however long each is.
    assert filtered(["ab", "xyzw"], ["1 xyz", "w 2"]) == (["1 ", ""], "", True)
    assert filtered(["abab"], ["xaba", "b"]) == (["x", ""], "", True), "the longest tail, not the shortest"


def test_multiple_eos_ids_each_stop(together, tok):
    """Llama 3 has several EOS ids; every one of them must stop a request. A checkpoint whose
    generation_config lists two ids that greedy decoding is known to reach shows it."""
    chosen = two_eos_ids(tok)
    if len(chosen) < 2:
        pytest.skip("greedy outputs too repetitive to pick two EOS ids")
    s = together.server("two_eos")
    ckpt = s.cmd[s.cmd.index("--model") + 1]
    assert json.loads((Path(ckpt) / "generation_config.json").read_text())["eos_token_id"] == list(chosen.values())
    c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
    for p, eos in chosen.items():
        out = c.completions.create(model=ckpt, prompt=p, max_tokens=12, temperature=0)
        assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 4, (p, eos)


# --- bad input: 4xx, an OpenAI error body, and the server still fine --------------------------------
BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 5000}, 400, None),  # over the 2048-token context
    ("/v1/completions", {"prompt": "Hello", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "Hello", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "Hello", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "Hello", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "Hello", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}, 400,
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "Hello", "seed": 1.5}, 400, "seed"),
    ("/v1/completions", {"prompt": "Hello", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "Hello", "model": "gpt-9"}, 404, "model"),
    ("/v1/completions", {"prompt": "Hello", "n": 65}, 400, "n"),  # more answers than one request may ask
    ("/v1/completions", {"prompt": "Hello", "logprobs": 21}, 400, "logprobs"),  # OpenAI's limit is 20
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
     "top_logprobs"),  # only with logprobs=true
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("/v1/completions", {"prompt": [10**9]}, 400, None),  # a token id outside the vocabulary
    ("/v1/completions", {"prompt": "Hello", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "Hello", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/nothing", {}, 404, None),
    # Refused by the tokenizer worker or the scheduler, before the first token: streamed or not,
    # the HTTP status says so (not a 200 whose only event is an error).
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 5000, "stream": True}, 400, None),
    ("/v1/completions", {"prompt": [10**9], "stream": True}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5000,
                              "stream": True}, 400, None),
    ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 5000}, "stream": True}, 400, None),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS, ids=[f"{i}:{b[1] if isinstance(b[1], bytes) else list(b[1])}"
                                                                       for i, b in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_an_openai_error(server, path, body, status, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server.url}{path}", headers={"content-type": "application/json"}, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and "param" in err and "code" in err
    if param is not None:
        assert err["param"] == param, err
    ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200, "the server must keep serving after a bad request"


# --- clients that go away ------------------------------------------------------------------------------
async def open_and_drop_streams(url: str, n: int, read_chunks: int = 2) -> int:
    """Start ``n`` long streams, read a few chunks of each, then disconnect; returns how many
    delivered chunks before being dropped."""
    body = {"prompt": "Hello", "max_tokens": 1500, "temperature": 0, "stream": True, "ignore_eos": True}

    async def one(client: httpx.AsyncClient) -> bool:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            got = 0
            async for line in r.aiter_lines():
                got += line.startswith("data: ")
                if got >= read_chunks:
                    return True  # leaving the block closes the connection mid-stream
        return False

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        return sum(await asyncio.gather(*(one(client) for _ in range(n))))


def test_fifty_dropped_streams_free_everything(server, client):
    assert asyncio.run(open_and_drop_streams(server.url, 50)) == 50
    start = time.monotonic()
    out = client.completions.create(model=str(tiny_checkpoint(ARCH)), prompt="Hello", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1 and time.monotonic() - start < 5
    m = wait_until_idle(server.url)
    assert m["minisgl_requests_total{finish_reason=\"abort\"}"] >= 50


def test_non_streaming_client_that_disconnects_is_aborted(server):
    before = server.metrics().get('minisgl_requests_total{finish_reason="abort"}', 0)
    body = json.dumps({"prompt": "Hello", "max_tokens": 1800, "ignore_eos": True, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)  # it is running now; hang up without reading
    wait_until_idle(server.url, timeout=10)
    assert server.metrics()['minisgl_requests_total{finish_reason="abort"}'] == before + 1


# --- the process as a whole -----------------------------------------------------------------------------
def test_api_key_and_clean_shutdown(together):
    with together.take("api_key") as s:
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        assert httpx.get(f"{s.url}/v1/models", headers={"Authorization": "Bearer s3creT"}).status_code == 401
        assert httpx.get(f"{s.url}/health").status_code == 200
        good = openai.OpenAI(base_url=f"{s.url}/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=str(tiny_checkpoint(ARCH)), prompt="Hi", max_tokens=2).usage.completion_tokens
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0).models.list()
        from minisgl.testing.processes import library_loaded, process_name

        assert {"minisgl-sched", "minisgl-tok"} <= {process_name(p) for p in s.children}
        # Only the scheduler runs torch: the API process and the tokenizer worker, having served
        # requests, still have not loaded it (each would pay a second of CPU per start).
        loads = {process_name(p): library_loaded(p, "libtorch") for p in [s.proc.pid, *s.children]}
        assert loads == {"minisgl-api": False, "minisgl-tok": False, "minisgl-sched": True}, loads
        if not any(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MINISGL_CPU_THREADS")):
            for child in s.children:  # the CPU thread policy reaches the children
                assert child_environ(child).get("OMP_NUM_THREADS") == "1", process_name(child)
    assert s.stop_seconds is not None and s.stop_seconds < 5  # ServerProcess also asserts no child is left


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signals_stop_everything_cleanly(together, sig):
    """Ctrl-C or SIGTERM: exit code 0, no traceback, every child gone (checked by stop())."""
    import signal

    s = together.server("SIGINT" if sig == "SIGINT" else "main")  # main: a server that has served a while
    s.stop(getattr(signal, sig))
    output = s.output()
    assert s.proc.returncode == 0 and "Traceback" not in output, output[-3000:]
    # The ready line is news, not a problem: logged at INFO, and it says how to stop the server.
    assert re.search(r"minisgl\.server INFO minisgl serving \S+ on http://127\.0\.0\.1:\d+ .*Ctrl-C stops it", output), output
    assert "WARNING minisgl serving" not in output


def test_a_child_that_cannot_start_stops_the_server_with_its_message(together):
    r = together.command("tiny_kv_budget", timeout=120)
    assert r.returncode == 1 and "cpu_kv_bytes=64" in r.stderr and "scheduler" in r.stderr, r.stderr[-2000:]
    # A bad flag value never gets that far: the settings are checked before any process starts.
    r = together.command("bad_page_size", timeout=60)
    assert r.returncode == 2 and "EngineConfig.page_size must be an integer >= 1, got 0" in r.stderr, r.stderr[-2000:]
    r = together.command("no_checkpoint", timeout=60)
    assert r.returncode == 1 and "/no/such/checkpoint" in r.stderr


def test_teeth_a_disconnect_that_does_not_abort_is_caught(together, monkeypatch):
    """The leak check of the tests above, against a server whose handlers forget to abort: the
    dropped streams keep running and holding KV, and ``wait_until_idle`` says so. (The server
    runs in this process, started with the others: ``serve_in_thread``.)"""
    from minisgl.server import api

    async def release_without_abort(self, rid: str, finished: bool) -> None:
        self.queues.pop(rid, None)  # the bug: no AbortRequest for an unfinished request

    monkeypatch.setattr(api.EngineClient, "release", release_without_abort)
    url = together.server("teeth")
    assert asyncio.run(open_and_drop_streams(url, 8)) == 8
    with pytest.raises(AssertionError, match="not idle"):
        wait_until_idle(url, timeout=2)


def test_shell_streams_a_chat(together):
    r = together.command("shell", stdin="Hello there\n/reset\nAgain\n/exit\n", timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("model> ") == 2 and "(conversation cleared)" in r.stdout
    assert r.stdout.count("prompt tokens") == 2
    # No client log line lands in the conversation (httpx logs every request at INFO).
    assert "HTTP Request" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


def test_a_child_that_dies_stops_the_server(together):
    """A server whose scheduler (or tokenizer) died cannot answer anything: it must exit, say
    why, and take the other child with it, not keep answering /health."""
    import signal

    from minisgl.testing.processes import process_alive, process_name

    s = together.server("child_dies")
    try:
        names = {process_name(p): p for p in s.children}
        assert {"minisgl-sched", "minisgl-tok"} <= set(names), names
        victim = names["minisgl-sched"]
        os.kill(victim, signal.SIGKILL)
        assert s.proc.wait(10) == 1
        assert "process died" in s.output()
        deadline = time.monotonic() + 5
        while any(process_alive(p) for p in s.children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(process_alive(p) for p in s.children)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_tensor_parallel_server_matches_hf(together, tok):
    """``--tp-size 2``: the scheduler process drives two rank processes (gloo on the CPU) one step
    at a time; the answers are HF's, aborts free KV on every rank, and SIGTERM leaves no rank."""
    from minisgl.testing.processes import descendant_pids, process_alive, process_name

    with together.take("tp") as s:
        # (the scheduler forks its ranks from its rank starter: they are its grandchildren)
        under = [p for child in s.children for p in descendant_pids(child)]
        ranks = [p for p in under if process_name(p).startswith("minisgl-rank")]
        assert len(ranks) == 2, "two rank processes under the scheduler process"
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        for prompt in TEST_PROMPTS[1:3]:
            ids, text = hf_answer(tok, tok.encode(prompt), 10)
            out = c.completions.create(model=str(tiny_checkpoint(ARCH)), prompt=prompt, max_tokens=10, temperature=0)
            assert (out.choices[0].text, out.usage.completion_tokens) == (text, len(ids))
        assert asyncio.run(open_and_drop_streams(s.url, 6)) == 6
        wait_until_idle(s.url)
    assert not [p for p in ranks if process_alive(p)], "a rank outlived the server"
    assert not [p for p in under if process_alive(p)], "a process under the scheduler outlived the server"
