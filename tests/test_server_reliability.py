"""Reliability under load: ``python -m minisgl`` attacked on the CPU with the tiny checkpoint.

Lesson 10's tests check that the server answers correctly; these check that it keeps doing so
when clients misbehave. Each test runs one scenario of :mod:`tests.tools.load` at test size
against a real server process and asserts the scenario's figures:

* **abort storm**: 200 streams (completions, chat, ``/generate``), 50 at a time, each dropped by
  its client after 1-5 events; a fresh request must answer within 5 s, the server must count 200
  aborts, and once idle every KV page must be free or in the prefix cache (the pool is read
  from ``/metrics``: ``total - free - cached`` pages leaked).
* **dropped before the first token**: with one running slot taken, 20 queued streams whose
  clients give up before their response starts (it starts with the first token): the handlers
  must abort them, and the engine is idle with every page back within 3 s.
* **over capacity**: a 32-page pool (4 tokens a page) and 24 concurrent greedy requests of
  about 8 pages each: all must get a 200 with exactly the tokens each gets alone (queued,
  retracted and readmitted requests included), and ``/metrics`` must show requests waiting.
* **SIGTERM under load**: 16 streams running, then SIGTERM: the server and its children are
  gone within 5 s, exit code 0, and every client stream ends cleanly: a last error event (503,
  "the server is shutting down"), then ``[DONE]``, and no traceback in the server's log.
* **schema-driven fuzz**: 1,000 ``hypothesis`` bodies from a table of each endpoint's fields
  (valid values, wrong types, NaN/Infinity literals, huge ints, lone surrogates, unknown keys,
  nested junk): never a 5xx, every 4xx an OpenAI error body, valid requests answered, invalid
  ones refused; afterwards idle, no page held, and the same greedy tokens as before.
* **malformed inputs**: not JSON, not an object, not UTF-8, 100,000 brackets deep, over
  ``MAX_BODY_BYTES`` (413, with Content-Length and chunked), absurd max_tokens, empty messages.
* **slow client**: a stream whose client (4 KiB receive buffer) reads nothing while 8 other
  requests run: they take about as long as without it, with the same tokens; its own request
  finishes in the engine meanwhile, and its stream carries exactly that request's tokens.
* **a chat template that refuses a conversation** (``raise_exception`` in the template): a 400
  for that request, and the server keeps serving.

The last two tests check the checks: the fuzz judge and the leak check do fail on bad answers.

Every server here runs with ``OMP_NUM_THREADS=1`` (see ``one_thread_per_process``).

Run: ``pytest tests/test_server_reliability.py -q`` (about 1.5 minutes on 2 cores). The same
scenarios, larger, for a longer run (servers started by the script):
``python -m tests.tools.load --scale 5 [--out load.json]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import shutil
from pathlib import Path

import httpx
import pytest

from minisgl.testing import tiny_checkpoint
from minisgl.testing.server import ServerProcess
from tests.tools.load import (
    ABORTED,
    OVER_CAPACITY_FLAGS,
    FuzzCase,
    Pool,
    abort_storm,
    judge,
    malformed_inputs,
    over_capacity,
    print_report,
    schema_fuzz,
    settle,
    sigterm_under_load,
    slow_client,
    stream_body,
)

ARCH = "qwen3"
START_S = 300  # for each server started together: on a busy 2-core machine they queue for the cores


@pytest.fixture(scope="module", autouse=True)
def one_thread_per_process():
    """One OpenMP thread in every server process started here. With one per core (the default),
    the scheduler's threads fight the API and tokenizer processes and the test client for two
    cores, and a 1-token request took ~150 ms instead of ~13 ms: the tests would measure that
    contention, not the server."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


STRICT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                   "{% endif %}{{ m['content'] }}{% endfor %}")


@pytest.fixture(scope="module")
def servers(one_thread_per_process, tmp_path_factory):
    """Every server this module attacks, started at once before the first test (a start is a
    chain of one busy process at a time, so several chains share two cores well); each test
    takes its own. Every start has finished before any test runs: no scenario shares the cores
    with a start-up."""
    strict = tmp_path_factory.mktemp("strict") / "strict_template"
    shutil.copytree(tiny_checkpoint(ARCH), strict)
    (strict / "chat_template.jinja").write_text(STRICT_TEMPLATE)
    tiny = tiny_checkpoint(ARCH)
    wanted = {
        "main": ServerProcess(tiny, "--page-size", "4", start_timeout=START_S),
        "one_slot": ServerProcess(tiny, "--page-size", "4", "--max-running", "1", start_timeout=START_S),
        "over_capacity": ServerProcess(tiny, *OVER_CAPACITY_FLAGS, start_timeout=START_S),
        "sigterm": ServerProcess(tiny, start_timeout=START_S),
        "strict_template": ServerProcess(strict, start_timeout=START_S),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        started = {name: pool.submit(s.__enter__) for name, s in wanted.items()}
    yield {name: future.result for name, future in started.items()}  # .result() raises a start-up's error
    for name, future in started.items():
        if future.exception() is None and wanted[name].proc.poll() is None:
            wanted[name].stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers["main"]()


@contextlib.contextmanager
def stopping(s: ServerProcess):
    """``with stopping(s):`` as ``with ServerProcess(...) as s:`` for a server started already."""
    try:
        yield s
    finally:
        s.stop()


def test_abort_storm_frees_every_page(server):
    r = asyncio.run(abort_storm(server.url, requests=200, wave=50))
    print_report(r)  # shown with -s, and under a failure
    assert (r.sent, r.aborted, r.completed, r.failed) == (200, 200, 0, 0), r
    assert r.statuses == {"200": 200}
    assert r.aborts_counted >= 200, "every dropped stream must be aborted in the engine"
    assert r.recovery_ok and r.recovery_s < 5, r
    assert r.pool.total > 0 and r.pool.idle and r.pool.leaked == 0, r.pool
    assert r.problems() == []


def test_streams_dropped_before_their_first_token_are_aborted(servers):
    """A streamed response starts only with its first token. With one running slot
    (``--max-running 1``) taken by a long stream, 20 more streams wait in the queue, and their
    clients give up (a 0.3 s timeout for the response to start) while the handlers still wait:
    the handlers must notice and abort them. Run instead, 20 requests of 2,000 tokens one at a
    time would keep the engine busy long after the 3 s the test gives it."""
    with stopping(servers["one_slot"]()) as s:
        url = f"{s.url}/v1/completions"

        async def impatient(client: httpx.AsyncClient, i: int) -> bool:
            try:
                async with client.stream("POST", url, json=stream_body("completions", f"Gone {i}", 2000)) as r:
                    await r.aread()
            except httpx.ReadTimeout:
                return True
            return False

        async def attack() -> int:
            async with httpx.AsyncClient(timeout=30) as client:
                async with client.stream("POST", url, json=stream_body("completions", "The one running", 2000)) as blocker:
                    async for line in blocker.aiter_lines():
                        if line.startswith("data: "):
                            break  # it runs: the only slot is taken
                    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=0.3)) as other:
                        gave_up = sum(await asyncio.gather(*(impatient(other, i) for i in range(20))))
                # leaving the block drops the blocker too
            return gave_up

        gave_up = asyncio.run(attack())
        # (Now and then one of them is admitted within the 0.3 s; its client then reads it all.)
        assert gave_up >= 15, f"only {gave_up} of 20 clients gave up before their response started"
        pool = asyncio.run(settle(s.url, timeout=3))
        assert pool.idle, f"the abandoned requests still run or wait {pool.seconds_to_idle:.1f} s later: not aborted"
        assert pool.leaked == 0, pool
        assert s.metrics()[ABORTED] >= gave_up + 1  # and the blocker


def test_over_capacity_queues_and_keeps_every_greedy_answer(servers):
    with stopping(servers["over_capacity"]()) as s:
        r = asyncio.run(over_capacity(s.url, requests=24, max_tokens=16))
    print_report(r)
    assert r.pool.total == 32, "the small pool asked for"
    assert (r.sent, r.completed, r.failed) == (24, 24, 0), r
    assert r.mismatched == [], "queued or retracted requests must get exactly their solo tokens"
    assert r.max_waiting > 0, "no request waited: the scenario proved nothing about queuing"
    assert r.pool.idle and r.pool.leaked == 0, r.pool
    assert r.problems() == []


def test_sigterm_under_load_exits_within_5_s_and_ends_every_stream(servers):
    s = servers["sigterm"]()
    try:
        r = asyncio.run(sigterm_under_load(s, streams=16))
        print_report(r)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert r.running_at_signal == 16, r
    assert r.stop_error is None and r.exit_s is not None and r.exit_s < 5, r
    assert r.exit_code == 0 and r.children_left == [], r
    # Every stream ends cleanly: a last event "the server is shutting down" (503), then [DONE];
    # none is cancelled mid-stream (a cut connection, and a traceback in the server's log).
    assert r.endings == {"done": 16} and r.told_shutting_down == 16, r
    assert r.tracebacks_logged == 0, r
    assert r.problems() == []


def test_schema_fuzz_never_5xx_and_leaves_the_engine_as_it_was(server):
    r = asyncio.run(schema_fuzz(server.url, cases=1000))
    print_report(r)
    assert r.cases >= 1000 and r.valid_cases > 200 and r.invalid_cases > 200, r
    assert r.failures == [], "\n".join(r.failures)
    assert not any(s.startswith("5") for s in r.statuses), r.statuses
    assert r.statuses.get("200", 0) >= r.valid_cases, "every valid case must be answered"
    assert r.alive and r.same_tokens, r
    assert r.pool.idle and r.pool.leaked == 0, r.pool
    assert r.problems() == []


def test_malformed_inputs_get_openai_errors(server):
    r = asyncio.run(malformed_inputs(server.url))
    print_report(r)
    assert r.failures == [], r.failures
    assert r.statuses["huge body, Content-Length"] == r.statuses["huge body, chunked"] == "413", r.statuses
    assert all(s.startswith("4") for s in r.statuses.values()), r.statuses
    assert r.alive


def test_slow_client_does_not_slow_the_others(server):
    r = asyncio.run(slow_client(server.url, others=8))
    print_report(r)
    assert r.with_slow_s <= max(2 * r.baseline_s, r.baseline_s + 1.0), (
        f"others: {r.with_slow_s:.2f} s with a stalled reader, {r.baseline_s:.2f} s without")
    assert r.others_same_tokens, "the other requests' tokens changed"
    assert r.engine_done_while_stalled, "the engine waited for a client that does not read"
    assert r.slow_correct and r.slow_events == 400, r
    assert r.gone_aborted, "a stalled client that hung up must be aborted"
    assert r.pool.idle and r.pool.leaked == 0, r.pool
    assert r.problems() == []


def test_a_chat_template_that_refuses_a_conversation_is_a_400_not_a_dead_server(servers):
    """Real chat templates refuse some conversations themselves (Mistral's and Gemma's call
    ``raise_exception`` on a system message or on roles that do not alternate): jinja2 raises
    ``TemplateError`` in the tokenizer worker. That exception used to end the worker, and with
    it the whole server, for one chat request; now it is that request's 400."""
    with stopping(servers["strict_template"]()) as s:
        assert (Path(s.cmd[s.cmd.index("--model") + 1]) / "chat_template.jinja").read_text() == STRICT_TEMPLATE
        refused = httpx.post(f"{s.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert refused.status_code == 400 and "System role not supported" in refused.json()["error"]["message"]
        ok = httpx.post(f"{s.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert ok.status_code == 200, "the server must keep serving"


# --- the checks themselves can fail ----------------------------------------------------------------
def answer(status: int, body: object | str, stream: bool = False) -> httpx.Response:
    """A response as the fuzz judge sees it (JSON, or a raw SSE text for a stream)."""
    if stream:
        return httpx.Response(status, text=str(body), headers={"content-type": "text/event-stream"})
    return httpx.Response(status, json=body)


def test_teeth_the_fuzz_judge_catches_each_kind_of_wrong_answer():
    valid = FuzzCase("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    invalid = FuzzCase("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "top_k": 2**63}, faults=["top_k"])
    good_error = {"error": {"message": "top_k must be ...", "type": "invalid_request_error", "param": "top_k",
                            "code": None}}
    good_answer = {"choices": [{"text": "ab", "finish_reason": "length"}], "usage": {"completion_tokens": 2}}
    assert judge(valid, answer(200, good_answer)) is None
    assert judge(invalid, answer(400, good_error)) is None
    assert "500" in judge(invalid, answer(500, good_error))
    assert "error" in judge(invalid, answer(400, {"detail": "Method Not Allowed"}))  # not OpenAI's shape
    assert "refused" in judge(valid, answer(400, good_error))  # validation too strict
    assert "accepted" in judge(invalid, answer(200, good_answer))  # validation too lax
    too_long = {**good_answer, "usage": {"completion_tokens": 3}}
    assert "malformed" in judge(valid, answer(200, too_long))  # more tokens than max_tokens
    streamed = FuzzCase("/generate", {"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 1}})
    event = 'data: {"text": "a", "output_ids": [5], "meta_info": {}}\n\n'
    assert judge(streamed, answer(200, event + "data: [DONE]\n\n", stream=True)) is None
    assert "[DONE]" in judge(streamed, answer(200, event, stream=True))  # a stream cut short
    error_event = "data: " + json.dumps(good_error) + "\n\ndata: [DONE]\n\n"
    assert "error event" in judge(streamed, answer(200, error_event, stream=True))


def test_teeth_the_leak_check_reads_the_pool():
    assert Pool(total=32, free=10, cached=20, idle=True).leaked == 2
    assert "leaked" in " ".join(Pool(total=32, free=10, cached=20, idle=True).problems())
    assert "no KV pool" in " ".join(Pool(total=0, idle=True).problems()), "an empty /metrics must not pass"
    assert Pool(total=32, free=12, cached=20, idle=True).problems() == []
