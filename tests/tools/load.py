"""Reliability under load: attack scenarios against a running ``python -m minisgl`` server.

Each scenario is an ``async`` function that takes the server's base URL (a few take the
:class:`~minisgl.testing.server.ServerProcess` itself), attacks it with ``httpx.AsyncClient``
and returns a small dataclass report: what was sent, what came back, and what the server looked
like afterwards (KV pages leaked, seconds to recover or exit). ``report.problems()`` lists what
went wrong, in words; an empty list means the server held up.

* :func:`abort_storm`: streams dropped by their clients after a few events, in waves; then a
  fresh request must finish within 5 s, and every KV page must come back.
* :func:`over_capacity`: far more concurrent greedy requests than a small KV pool holds: all
  must finish, each with exactly the tokens it gets alone, and some must have waited.
* :func:`sigterm_under_load`: SIGTERM while many streams run: the server and its children exit
  within 5 s, and every client stream ends (none hangs).
* :func:`schema_fuzz`: ``hypothesis`` bodies for the three generation endpoints, built from a
  table of each endpoint's fields (valid values, wrong types, out-of-range numbers, NaN and
  Infinity literals, huge ints, lone surrogates, unknown keys, nested junk): never a 5xx, every
  4xx an OpenAI error body, every 200 well formed, valid requests answered, invalid refused.
* :func:`malformed_inputs`: bodies that are not JSON, not objects, not UTF-8, too deep, too big
  (413), and absurd values: each a 4xx with an error body.
* :func:`slow_client`: one stream whose client stops reading (small receive buffer) while other
  requests run: they must not slow down, and the slow stream stays correct.

``tests/test_server_reliability.py`` runs every scenario at test size on the tiny checkpoint.
For a longer run::

    python -m tests.tools.load                     # starts the tiny checkpoint itself, test sizes
    python -m tests.tools.load --scale 5 --out load.json
    python -m tests.tools.load --model demo --scale 3
    python -m tests.tools.load --base-url http://127.0.0.1:1919 [--small-pool-url URL]

With no ``--base-url`` the script starts the servers it needs itself (``--model``, default the
tiny test checkpoint; ``--device``, default cpu): one shared server, one with a small KV pool
(:data:`OVER_CAPACITY_FLAGS`) and one to SIGTERM. With ``--base-url`` it attacks that server,
skips the SIGTERM scenario (it has no process to signal), and runs the over-capacity one only
against ``--small-pool-url``, a second server started with ``--num-pages 32 --page-size 4``
(on a large pool nothing would ever wait).
On the CPU the servers started here get ``OMP_NUM_THREADS=1`` unless it is set (see
:func:`main`). The exit code is 1 if any scenario reported a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from minisgl.server.metrics import parse_metrics
from minisgl.testing.processes import process_alive
from minisgl.testing.server import ServerProcess, wait_until_idle

# A prompt whose greedy answer is checked before and after an attack: the same tokens, or the
# attack changed the engine's state.
PROBE_PROMPT = "The key and value vectors"
# Long enough that no stream of the abort storm or the SIGTERM run ends by itself first; short
# enough to fit the demo model's 512-token context.
LONG_TOKENS = 400
# A KV pool that holds only a few requests of over_capacity at once (32 pages of 4 tokens).
OVER_CAPACITY_FLAGS = ("--page-size", "4", "--num-pages", "32")
ABORTED = 'minisgl_requests_total{finish_reason="abort"}'


# --- shared pieces ----------------------------------------------------------------------------------
@dataclass
class Report:
    """What every scenario reports: its name and how long it took; subclasses add figures."""

    scenario: str = ""
    seconds: float = 0.0

    def problems(self) -> list[str]:
        """What went wrong, one sentence each; empty if the server held up."""
        return []

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "problems": self.problems()}


@dataclass
class Pool:
    """The KV pool after a scenario, read from ``/metrics`` once the server is idle (or gave up
    trying): ``leaked`` pages are neither free nor in the prefix cache, so some request that no
    longer exists still holds them."""

    total: int = 0
    free: int = 0
    cached: int = 0
    idle: bool = False
    seconds_to_idle: float = 0.0
    leaked: int = field(init=False)

    def __post_init__(self) -> None:
        self.leaked = self.total - self.free - self.cached

    def problems(self) -> list[str]:
        if self.total == 0:
            return ["/metrics reports no KV pool (no engine step ran?): the leak check read nothing"]
        out = [] if self.idle else [f"not idle {self.seconds_to_idle:.1f} s after the attack"]
        if self.leaked:
            out.append(f"{self.leaked} of {self.total} KV pages leaked (held, but no request runs)")
        return out


async def fetch_metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    return parse_metrics((await client.get(f"{url}/metrics", timeout=10)).text)


async def settle(url: str, timeout: float = 10.0) -> Pool:
    """Wait (:func:`wait_until_idle`) until nothing runs or waits and no page is held by a
    request; then read the pool. Gives up after ``timeout`` seconds, with ``idle=False``."""
    start = time.monotonic()
    try:
        m = await asyncio.to_thread(wait_until_idle, url, timeout)
        idle = True
    except AssertionError:
        async with httpx.AsyncClient() as client:
            m = await fetch_metrics(client, url)
        idle = False
    return Pool(int(m["minisgl_kv_pages_total"]), int(m["minisgl_kv_pages_free"]), int(m["minisgl_kv_pages_cached"]),
                idle, time.monotonic() - start)


async def greedy_ids(client: httpx.AsyncClient, url: str, text: str, n: int, timeout: float = 60.0) -> list[int]:
    """The ``n`` greedy token ids (EOS ignored) that ``/generate`` answers for ``text``."""
    r = await client.post(f"{url}/generate", timeout=timeout, json={
        "text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()["output_ids"]


def error_body_problem(body: Any) -> str | None:
    """None if ``body`` is OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``
    (a non-empty message and type), else what is wrong with it."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return f"no 'error' object in {str(body)[:200]!r}"
    if set(error) != {"message", "type", "param", "code"}:
        return f"error keys {sorted(error)} are not message, type, param, code"
    if not (isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str) and error["type"]):
        return f"empty error message or type: {error}"
    if not (error["param"] is None or isinstance(error["param"], str)):
        return f"error param {error['param']!r} is neither a string nor null"
    return None


def response_error_problem(r: httpx.Response) -> str | None:
    """:func:`error_body_problem` for a 4xx response (its body must be JSON)."""
    try:
        return error_body_problem(r.json())
    except ValueError:
        return f"a {r.status_code} whose body is not JSON: {r.text[:200]!r}"


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of a server-sent-event stream, in order (``"[DONE]"`` included)."""
    return [block[len("data: "):] for block in text.split("\n\n") if block.startswith("data: ")]


def stream_body(endpoint: str, text: str, max_tokens: int) -> dict[str, Any]:
    """A streaming greedy request to ``endpoint`` (``completions``, ``chat`` or ``generate``)
    that ignores EOS, so that it runs its whole ``max_tokens``."""
    if endpoint == "generate":
        return {"text": text, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    if endpoint == "chat":
        return {"messages": [{"role": "user", "content": text}], **common}
    return {"prompt": text, **common}


ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}


# --- 1. abort storm ---------------------------------------------------------------------------------
@dataclass
class AbortStormReport(Report):
    sent: int = 0
    aborted: int = 0  # streams we dropped after reading their k chunks (all of them, if all is well)
    completed: int = 0  # streams that ended by themselves before k chunks (max_tokens too small)
    failed: int = 0  # not a 200, a broken stream, an error event, a client error
    statuses: dict[str, int] = field(default_factory=dict)
    aborts_counted: int = 0  # the server's own count of aborted requests during the storm
    recovery_s: float = 0.0  # a fresh request after the storm: seconds to its whole answer
    recovery_ok: bool = False
    pool: Pool = field(default_factory=Pool)

    def problems(self) -> list[str]:
        out = []
        if self.failed or self.completed:
            out.append(f"{self.failed} failed and {self.completed} completed streams of {self.sent}: every one should "
                       f"have been dropped mid-way")
        if self.aborts_counted < self.aborted:
            out.append(f"the server counted {self.aborts_counted} aborts for {self.aborted} dropped streams")
        if not self.recovery_ok or self.recovery_s > 5:
            out.append(f"the fresh request after the storm took {self.recovery_s:.1f} s (ok={self.recovery_ok}); "
                       f"limit 5 s")
        return out + self.pool.problems()


async def abort_storm(url: str, requests: int = 200, wave: int = 50, max_chunks: int = 5,
                      max_tokens: int = LONG_TOKENS) -> AbortStormReport:
    """``requests`` streaming requests, ``wave`` at a time (completions, chat and ``/generate`` in
    turn, each prompt different), each dropped by its client after reading ``k`` events
    (``k = 1 .. max_chunks``); then a fresh request must answer within 5 s, and once idle no KV
    page may be held."""
    report = AbortStormReport("abort_storm", sent=requests)
    statuses: Counter[str] = Counter()
    endpoints = list(ENDPOINT_PATHS)

    async def one(client: httpx.AsyncClient, i: int) -> str:
        endpoint, k = endpoints[i % 3], 1 + i % max_chunks
        body = stream_body(endpoint, f"Storm {i}: please say something long", max_tokens)
        try:
            async with client.stream("POST", url + ENDPOINT_PATHS[endpoint], json=body) as r:
                statuses[str(r.status_code)] += 1
                if r.status_code != 200:
                    return "failed"
                seen = 0
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        return "completed"
                    if '"error"' in line[:20]:
                        return "failed"
                    seen += 1
                    if seen >= k:
                        return "aborted"  # leaving the block closes the connection mid-stream
                return "failed"  # the stream ended without [DONE]
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1
            return "failed"

    start = time.monotonic()
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=wave)) as client:
        before = (await fetch_metrics(client, url)).get(ABORTED, 0.0)
        outcomes: Counter[str] = Counter()
        for first in range(0, requests, wave):
            outcomes.update(await asyncio.gather(*(one(client, i) for i in range(first, min(first + wave, requests)))))
        report.aborted, report.completed, report.failed = outcomes["aborted"], outcomes["completed"], outcomes["failed"]
        t = time.monotonic()
        try:
            report.recovery_ok = len(await greedy_ids(client, url, PROBE_PROMPT, 8, timeout=30)) == 8
        except httpx.HTTPError:
            report.recovery_ok = False
        report.recovery_s = time.monotonic() - t
        report.pool = await settle(url)
        report.aborts_counted = int((await fetch_metrics(client, url)).get(ABORTED, 0.0) - before)
    report.statuses, report.seconds = dict(statuses), time.monotonic() - start
    return report


# --- 2. over capacity -------------------------------------------------------------------------------
@dataclass
class OverCapacityReport(Report):
    sent: int = 0
    completed: int = 0  # 200s
    failed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    mismatched: list[int] = field(default_factory=list)  # requests whose tokens differ from their solo run
    max_waiting: int = 0  # most minisgl_num_waiting_requests seen while polling /metrics
    max_running: int = 0
    solo_s: float = 0.0
    concurrent_s: float = 0.0
    pool: Pool = field(default_factory=Pool)

    def problems(self) -> list[str]:
        out = []
        if self.completed != self.sent:
            out.append(f"{self.completed} of {self.sent} requests completed (statuses {self.statuses})")
        if self.mismatched:
            out.append(f"requests {self.mismatched} got other tokens than when sent alone")
        if self.max_waiting == 0:
            out.append("no request ever waited: the pool is too large for this scenario to show queuing")
        return out + self.pool.problems()


def over_capacity_prompt(i: int) -> str:
    from minisgl.testing.checkpoints import TEST_PROMPTS

    return f"Request {i}: {TEST_PROMPTS[i % len(TEST_PROMPTS)]}"


async def over_capacity(url: str, requests: int = 24, max_tokens: int = 16, poll_s: float = 0.01) -> OverCapacityReport:
    """Meant for a server started with :data:`OVER_CAPACITY_FLAGS` (a few requests' worth of KV):
    first each request alone (greedy, EOS ignored), then all ``requests`` at once while a poller
    reads ``/metrics``. Every one must complete with exactly its solo tokens (queued, retracted
    and readmitted requests included), and some must have waited."""
    report = OverCapacityReport("over_capacity", sent=requests)
    prompts = [over_capacity_prompt(i) for i in range(requests)]
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=requests + 2)) as client:
        solo = [await greedy_ids(client, url, p, max_tokens) for p in prompts]
        report.solo_s = time.monotonic() - start
        await settle(url)
        done = asyncio.Event()

        async def poll() -> None:
            while not done.is_set():
                m = await fetch_metrics(client, url)
                report.max_waiting = max(report.max_waiting, int(m["minisgl_num_waiting_requests"]))
                report.max_running = max(report.max_running, int(m["minisgl_num_running_requests"]))
                await asyncio.sleep(poll_s)

        async def one(prompt: str) -> httpx.Response | BaseException:
            try:
                return await client.post(f"{url}/generate", json={"text": prompt, "sampling_params": {
                    "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})
            except httpx.HTTPError as exc:
                return exc

        poller = asyncio.create_task(poll())
        t = time.monotonic()
        answers = await asyncio.gather(*(one(p) for p in prompts))
        report.concurrent_s = time.monotonic() - t
        done.set()
        await poller
    statuses: Counter[str] = Counter()
    for i, (answer, expected) in enumerate(zip(answers, solo)):
        if isinstance(answer, BaseException):
            statuses[type(answer).__name__] += 1
            continue
        statuses[str(answer.status_code)] += 1
        if answer.status_code == 200 and answer.json()["output_ids"] != expected:
            report.mismatched.append(i)
    report.statuses = dict(statuses)
    report.completed = statuses["200"]
    report.failed = requests - report.completed
    report.pool = await settle(url)
    report.seconds = time.monotonic() - start
    return report


# --- 3. SIGTERM under load --------------------------------------------------------------------------
@dataclass
class SigtermReport(Report):
    streams: int = 0
    running_at_signal: int = 0  # streams that had received a first event when SIGTERM was sent
    endings: dict[str, int] = field(default_factory=dict)  # done / cut / hung / error: how each stream ended
    exit_s: float | None = None  # SIGTERM until the server process and its children are gone
    exit_code: int | None = None
    children_left: list[int] = field(default_factory=list)
    stop_error: str | None = None  # what ServerProcess.stop raised (too slow, a child left)
    streams_ended_s: float = 0.0  # SIGTERM to the end of the last client stream
    exit_limit_s: float = 5.0
    tracebacks_logged: int = 0  # in the server's output (uvicorn logs each stream it cancels at shutdown)
    told_shutting_down: int = 0  # streams whose last event before [DONE] was the 503 "shutting down" error

    def problems(self) -> list[str]:
        out = []
        if self.running_at_signal < self.streams:
            out.append(f"only {self.running_at_signal} of {self.streams} streams were running when SIGTERM came")
        if self.stop_error or self.exit_s is None or self.exit_s > self.exit_limit_s:
            out.append(f"the server did not stop cleanly within {self.exit_limit_s} s: {self.stop_error or self.exit_s}")
        if self.children_left:
            out.append(f"child processes {self.children_left} outlived the server")
        if self.endings.get("hung") or self.endings.get("error"):
            out.append(f"client streams did not end cleanly: {self.endings}")
        return out


async def sigterm_under_load(server: ServerProcess, streams: int = 16, max_tokens: int = LONG_TOKENS,
                             client_timeout: float = 10.0) -> SigtermReport:
    """Start ``streams`` long streams on ``server``; once each has sent a first event, SIGTERM
    it (``server.stop()``: the process and every child must be gone within its ``stop_timeout``).
    Every client stream must then end: ``done`` (it got ``[DONE]``; our server sends a 503
    "shutting down" event first, counted in ``told_shutting_down``), or ``cut`` (the connection
    closed mid-stream); ``hung`` means no byte came for ``client_timeout`` seconds."""
    report = SigtermReport("sigterm_under_load", streams=streams, exit_limit_s=server.stop_timeout)
    started = asyncio.Semaphore(0)
    url = server.url

    ended: list[float] = []

    async def one(client: httpx.AsyncClient, i: int) -> str:
        endpoint = list(ENDPOINT_PATHS)[i % 3]
        body = stream_body(endpoint, f"Stream {i} before the end", max_tokens)
        first, last_event = True, ""
        try:
            async with client.stream("POST", url + ENDPOINT_PATHS[endpoint], json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and first:
                        first = False
                        started.release()
                    if line == "data: [DONE]":
                        report.told_shutting_down += "shutting down" in last_event and '"error"' in last_event
                        return "done"
                    if line.startswith("data: "):
                        last_event = line
            return "cut"  # the body ended without [DONE]
        except httpx.TimeoutException:
            return "hung"
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
            return "cut"
        except httpx.HTTPError as exc:
            return f"error: {type(exc).__name__}"
        finally:
            ended.append(time.monotonic())
            if first:
                started.release()  # never started: do not keep the signal waiting

    start = time.monotonic()
    async with httpx.AsyncClient(timeout=client_timeout, limits=httpx.Limits(max_connections=streams)) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(streams)]
        for _ in range(streams):
            await asyncio.wait_for(started.acquire(), 60)
        report.running_at_signal = sum(not t.done() for t in tasks)
        signalled = time.monotonic()
        try:
            await asyncio.to_thread(server.stop)  # SIGTERM; asserts the exit and the children's
        except AssertionError as exc:
            report.stop_error = str(exc)
        report.exit_s = server.stop_seconds if server.stop_seconds is not None else time.monotonic() - signalled
        report.exit_code = server.proc.returncode if server.proc is not None else None
        report.children_left = [p for p in server.children if process_alive(p)]
        endings = await asyncio.gather(*tasks)
        report.streams_ended_s = max(ended) - signalled
    report.tracebacks_logged = server.output().count("Traceback (most recent call last)")
    report.endings = dict(Counter("error" if e.startswith("error") else e for e in endings))
    report.seconds = time.monotonic() - start
    return report


# --- 4. schema-driven fuzz --------------------------------------------------------------------------
# Each endpoint's fields, with three pools of values each: ``valid`` (the server must accept
# them), ``invalid`` (it must refuse them with a 4xx) and ``edge`` (its choice, but never a 5xx).
# A case leaves a field out or draws it from one pool. A third of the cases are "clean" (valid
# values only: they must get a well-formed 200), a third have exactly one invalid field (each
# check of the server alone), a third mix every pool; a case with an invalid field must be
# refused.
#
# max_tokens (max_new_tokens for /generate) is never left out nor null: a valid request without
# it generates up to the whole context (2048 tokens on the tiny model, seconds per case).
MISSING = object()  # "leave this field out"


@dataclass(frozen=True)
class Field:
    """One field of an endpoint: hypothesis strategies for its three pools of values."""

    valid: Any
    invalid: Any
    edge: Any = None
    required: bool = False  # never left out (left out, it would be a fault, or too slow a case)


@dataclass
class FuzzCase:
    """One request body and what the table says about it: ``faults`` are the fields drawn from
    an invalid pool (then the server must refuse it), ``edges`` those from an edge pool."""

    path: str
    body: Any
    faults: list[str] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)
    mode: str = "mixed"  # "clean": valid values only; "one_fault": one invalid field; "mixed": any

    @property
    def raw(self) -> bytes:
        """The body as JSON; NaN and infinities become the ``NaN``/``Infinity`` literals that
        strict JSON forbids but Python's parser (the server's) accepts."""
        return json.dumps(self.body, allow_nan=True).encode()

    @property
    def kind(self) -> str:
        return "invalid" if self.faults else "edge" if self.edges else "valid"

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def max_tokens(self) -> int:
        """The length limit of a case without faults."""
        if self.path == "/generate":
            return self.body["sampling_params"]["max_new_tokens"]
        limits = [self.body.get(k) for k in ("max_tokens", "max_completion_tokens") if self.body.get(k) is not None]
        return limits[-1]  # the server reads max_completion_tokens last


def fuzz_cases(served: str):
    """The hypothesis strategy of :class:`FuzzCase` s for a server that serves model ``served``."""
    from hypothesis import strategies as st

    from minisgl.server.protocol import MAX_STOP_STRINGS, ROLES, UNSUPPORTED

    # --- values -------------------------------------------------------------------------------------
    non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
    huge_ints = st.sampled_from([2**63, 2**64, 2**100, 10**400, -(2**64)])
    surrogates = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"])  # not Unicode, yet JSON can say them
    text = st.text(max_size=30)  # any Unicode but lone surrogates
    leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text, huge_ints)
    nested_junk = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=5), inner, max_size=3), max_leaves=8)
    not_number = st.one_of(text, st.booleans(), st.lists(st.integers(), max_size=2),
                           st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.sampled_from(["1", "0.5"]))
    non_integral = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
    # (4.0 is an integer, as JSON Schema says: accepted; 1e30 is one past int64: refused)
    not_int = st.one_of(not_number, non_integral, st.just(1e30), non_finite)
    token_ids = st.lists(st.integers(0, 255), min_size=1, max_size=8)  # inside any vocabulary we serve
    bad_token_ids = st.one_of(st.lists(st.integers(max_value=-1), min_size=1, max_size=3),  # (["7"] is a prompt)
                              st.sampled_from([[1.5], [True], [None], [10**7], [2**64], [2**63]]))
    prompt_text = st.text(min_size=1, max_size=30)  # at least one token for any tokenizer; fits any context

    # --- the field table ------------------------------------------------------------------------------
    max_tokens = Field(st.integers(1, 4), st.one_of(not_int, st.integers(max_value=0), huge_ints, st.just(5000)),
                       required=True)
    sampling = {
        "temperature": Field(st.one_of(st.just(0), st.floats(0, 2), st.integers(0, 2), st.none()),
                             st.one_of(not_number, st.floats(max_value=-1e-9), non_finite, st.just(10**400)),
                             st.sampled_from([1e-320, 5e-324, 1e300, 2**64])),
        "top_p": Field(st.one_of(st.floats(1e-6, 1), st.just(1), st.none()),
                       st.one_of(not_number, st.floats(max_value=0), st.floats(min_value=1.000001, allow_infinity=False),
                                 non_finite, st.just(10**400)),
                       st.sampled_from([1e-50, 5e-324, 1e-40, 1e-38])),  # zero in float32, where the sampler works
        "top_k": Field(st.one_of(st.integers(-1, 50), st.none()),
                       st.one_of(not_int, st.integers(max_value=-2), st.sampled_from([2**63, 2**64, 10**400])),
                       st.sampled_from([10**6, 2**62, 2**63 - 1])),
        "seed": Field(st.one_of(st.integers(-(2**63), 2**63 - 1), st.none()),  # any int64
                      st.one_of(not_int, st.integers(max_value=-(2**63) - 1), st.sampled_from([2**63, 2**64]))),
        "stop": Field(st.one_of(st.text(min_size=1, max_size=5), st.lists(st.text(min_size=1, max_size=5), max_size=3),
                                st.none()),
                      st.one_of(st.sampled_from(["", [""], [1], {"a": "b"}, True, ["x"] * (MAX_STOP_STRINGS + 1)]),
                                st.integers(), surrogates, surrogates.map(lambda s: [s]))),
        "stop_token_ids": Field(st.one_of(st.lists(st.integers(0, 255), max_size=3), st.none()),
                                st.one_of(bad_token_ids, st.text(min_size=1), st.sampled_from([{"a": 1}, [[1]], ["7"]])),
                                st.sampled_from([0, "", {}, False])),  # falsy: read as "none"
        "ignore_eos": Field(st.one_of(st.booleans(), st.none()), st.one_of(st.integers(), st.text(), st.just([True]))),
    }
    message = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.one_of(
        st.text(max_size=30), st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}),
                                       max_size=2))})
    bad_message = st.sampled_from([{"role": "wizard", "content": "hi"}, {"role": "user"}, {"role": "user", "content": 5},
                                   {"role": "user", "content": [{"type": "image_url", "image_url": "x"}]},
                                   {"content": "hi"}, 1, "user", {"role": "user", "content": "\ud800"}])
    completions = {
        "prompt": Field(st.one_of(prompt_text, token_ids, prompt_text.map(lambda s: [s]), token_ids.map(lambda t: [t])),
                        st.one_of(bad_token_ids, surrogates, st.sampled_from(["", [], [[]], ["a", ""], None, 5, {"p": 1}])),
                        required=True),
        "max_tokens": max_tokens, **sampling}
    chat = {
        "messages": Field(st.lists(message, min_size=1, max_size=3),
                          st.one_of(st.lists(bad_message, min_size=1, max_size=2), st.tuples(message, bad_message).map(list),
                                    st.sampled_from([[], "hi", None, {"role": "user", "content": "hi"}])),
                          required=True),
        "max_tokens": max_tokens,
        "max_completion_tokens": Field(st.one_of(st.integers(1, 4), st.none()), max_tokens.invalid),
        **sampling}
    generate_sampling = {"max_new_tokens": max_tokens, **sampling}

    # --- drawing a case ---------------------------------------------------------------------------
    def fields(draw, table: dict[str, Field], case: FuzzCase) -> dict[str, Any]:
        """Every field of ``table``: left out, or drawn from one of its pools (the invalid pool
        for one field only, in a one-fault case)."""
        out = {}
        faulty = draw(st.sampled_from(sorted(table))) if case.mode == "one_fault" else None
        for name, spec in table.items():
            pools = ([] if spec.required else ["missing"] * 4) + ["valid"] * 4
            if case.mode == "mixed":
                pools += ["invalid"] * 2 + (["edge"] * 2 if spec.edge is not None else [])
            pool = "invalid" if name == faulty else draw(st.sampled_from(pools))
            if pool == "missing":
                continue
            out[name] = draw(getattr(spec, pool))
            if pool == "invalid":
                case.faults.append(name)
            elif pool == "edge":
                case.edges.append(name)
        return out

    def option(draw, case: FuzzCase, name: str, valid: list, invalid: list) -> Any:
        """One of a few listed values (by position, so that ``1 == True`` confuses nothing);
        only valid ones unless the case is mixed."""
        values = valid + (invalid if case.mode == "mixed" else [])
        i = draw(st.integers(0, len(values) - 1))
        if i >= len(valid):
            case.faults.append(name)
        return values[i]

    def common(draw, case: FuzzCase) -> None:
        """What completions and chat share: stream and stream_options (only with stream=true),
        model, parameters the server refuses (their "not used" value is fine), unknown keys."""
        body = case.body
        stream = option(draw, case, "stream", [MISSING, MISSING, None, False, True, True], ["yes", 1])
        if stream is True:
            options = option(draw, case, "stream_options", [MISSING, None, {}, {"include_usage": True},
                                                            {"include_usage": False}], ["x", {"include_usage": "yes"}, []])
        else:
            options = option(draw, case, "stream_options", [MISSING, MISSING, None], [{"include_usage": True}, {}])
        model = option(draw, case, "model", [MISSING, None, served], ["gpt-4o", 5, ""])
        for name, value in (("stream", stream), ("stream_options", options), ("model", model)):
            if value is not MISSING:
                body[name] = value
        for name in draw(st.lists(st.sampled_from(sorted(UNSUPPORTED)), max_size=2, unique=True)):
            body[name] = option(draw, case, name, list(UNSUPPORTED[name]), [2, "x", [1], {"a": 1}, 0.5])
        body.update(unknown(draw, case))

    modes = st.sampled_from(["clean", "one_fault", "mixed"])
    unknown_keys = st.dictionaries(st.text(max_size=8).map(lambda s: "x_" + s), nested_junk, max_size=2)

    def unknown(draw, case: FuzzCase) -> dict:
        """Keys no endpoint implements (mixed cases only): the server must refuse them with a
        400 naming them, never accept and ignore them."""
        keys = draw(unknown_keys) if case.mode == "mixed" else {}
        if keys:
            case.faults.append("unknown parameter")
        return keys

    @st.composite
    def completion_case(draw) -> FuzzCase:
        case = FuzzCase("/v1/completions", {}, mode=draw(modes))
        case.body.update(fields(draw, completions, case))
        common(draw, case)
        return case

    @st.composite
    def chat_case(draw) -> FuzzCase:
        case = FuzzCase("/v1/chat/completions", {}, mode=draw(modes))
        case.body.update(fields(draw, chat, case))
        if case.body.get("max_tokens") == 5000 and case.body.get("max_completion_tokens") is not None:
            case.faults.remove("max_tokens")  # too long only if it is the limit; the later name wins
        common(draw, case)
        return case

    @st.composite
    def generate_case(draw) -> FuzzCase:
        case = FuzzCase("/generate", {}, mode=draw(modes))
        prompt = option(draw, case, "text/input_ids", [{"text": draw(prompt_text)}, {"input_ids": draw(token_ids)}],
                        [{}, {"text": ""}, {"text": draw(prompt_text), "input_ids": draw(token_ids)}, {"text": 5},
                         {"input_ids": []}, {"input_ids": [-1]}, {"text": "a\udfffb"},
                         {"input_ids": None, "text": "ok"}, {"input_ids": [10**7]}, {"input_ids": [2**64]},
                         {"input_ids": ["7"]}])
        case.body.update(prompt)
        # Not an object at all, sometimes; a falsy one would mean "the defaults" (128 tokens: slow).
        params = option(draw, case, "sampling_params", [MISSING] * 9, ["x", [1], 5, True, [{"max_new_tokens": 1}]])
        if params is MISSING:
            params = {**fields(draw, generate_sampling, case), **unknown(draw, case)}
        case.body["sampling_params"] = params
        stream = option(draw, case, "stream", [MISSING, None, False, True], ["yes", 0])
        if stream is not MISSING:
            case.body["stream"] = stream
        case.body.update(unknown(draw, case))
        return case

    not_an_object = st.builds(lambda path, body: FuzzCase(path, body, ["body"]),
                              st.sampled_from(list(ENDPOINT_PATHS.values())),
                              st.one_of(st.lists(leaf, max_size=3), st.integers(), st.text(), st.none(), st.booleans()))
    return st.one_of(completion_case(), chat_case(), generate_case(), not_an_object)


def stream_error_event(r: httpx.Response) -> bool:
    """A 200 stream that carries an error event: a request refused after its stream began (the
    tokenizer or the scheduler found it invalid: too long for the context, ids outside the
    vocabulary)."""
    return r.headers.get("content-type", "").startswith("text/event-stream") and any(
        e.startswith('{"error"') for e in sse_events(r.text))


def well_formed_problem(case: FuzzCase, r: httpx.Response) -> str | None:
    """None if the 200 answer to a case without faults has the shape its endpoint promises,
    at most ``max_tokens`` tokens, else what is wrong."""
    if case.stream:
        events = sse_events(r.text)
        if not events or events[-1] != "[DONE]":
            return f"the stream does not end with [DONE]: {r.text[-200:]!r}"
        tokens = 0
        for event in events[:-1]:
            chunk = json.loads(event)
            if "error" in chunk:
                return f"an error event for a request with no invalid field: {event[:300]}"
            if case.path == "/generate":  # cumulative: each event extends the one before
                if not isinstance(chunk.get("text"), str) or not isinstance(chunk.get("output_ids"), list):
                    return f"a bad /generate event: {event[:300]}"
                if len(chunk["output_ids"]) < tokens:
                    return f"a /generate event shorter than the one before it: {event[:300]}"
                tokens = len(chunk["output_ids"])
            elif chunk.get("choices"):
                tokens += 1  # one event per token
            elif "usage" not in chunk:
                return f"an event with neither choices nor usage: {event[:300]}"
        return None if tokens <= case.max_tokens else f"{tokens} tokens streamed for max_tokens={case.max_tokens}"
    body = r.json()
    if case.path == "/generate":
        ok = isinstance(body.get("text"), str) and isinstance(body.get("output_ids"), list)
        n = len(body.get("output_ids") or [])
    else:
        choice = (body.get("choices") or [{}])[0]
        text = choice.get("text") if case.path == "/v1/completions" else (choice.get("message") or {}).get("content")
        ok = isinstance(text, str) and choice.get("finish_reason") in ("stop", "length")
        n = (body.get("usage") or {}).get("completion_tokens", -1)
    if not ok or not 0 <= n <= case.max_tokens:
        return f"a malformed 200 ({n} tokens for max_tokens={case.max_tokens}): {str(body)[:300]}"
    return None


@dataclass
class FuzzReport(Report):
    cases: int = 0
    valid_cases: int = 0  # valid values only: each must get a well-formed 200
    invalid_cases: int = 0  # an invalid field: each must be refused
    edge_cases: int = 0  # edge values, no invalid one: a 200 or a 4xx
    statuses: dict[str, int] = field(default_factory=dict)  # "200+error": a stream that carried an error event
    failed_cases: int = 0  # cases whose answer broke a rule of judge()
    failures: list[str] = field(default_factory=list)  # the five smallest of them, and the rule broken
    alive: bool = False
    same_tokens: bool = False  # the probe prompt's greedy tokens equal before and after the fuzz
    pool: Pool = field(default_factory=Pool)

    def problems(self) -> list[str]:
        out = [f"{self.failed_cases} of {self.cases} cases broke a rule; the smallest: {f}" for f in self.failures[:1]]
        if not self.alive:
            out.append("the server is not alive after the fuzz")
        if not self.same_tokens:
            out.append("the probe prompt's greedy tokens changed after the fuzz")
        return out + self.pool.problems()


def judge(case: FuzzCase, r: httpx.Response) -> str | None:
    """The rules every answer must follow; None, or the rule broken:

    * never a 5xx; every 4xx has an OpenAI error body;
    * a case with an invalid field is refused: a 4xx, or a stream that carries an error event;
    * a case of valid values only gets a 200, well formed (edge values: a 200 or a 4xx)."""
    if r.status_code >= 500:
        return f"a {r.status_code}: {r.text[:300]}"
    if 400 <= r.status_code < 500:
        if problem := response_error_problem(r):
            return problem
        return None if case.faults or case.edges else f"a valid request was refused: {r.status_code} {r.text[:300]}"
    if r.status_code != 200:
        return f"an unexpected status {r.status_code}"
    if case.faults:
        return None if stream_error_event(r) else f"the invalid field(s) {case.faults} were accepted"
    return well_formed_problem(case, r)


def draw_fuzz_cases(served: str, n: int) -> list[FuzzCase]:
    """``n`` cases from :func:`fuzz_cases`, the same ones every run (``derandomize``)."""
    from hypothesis import HealthCheck, given, settings

    cases: list[FuzzCase] = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(fuzz_cases(served))
    def collect(case: FuzzCase) -> None:
        cases.append(case)

    collect()
    return cases


async def schema_fuzz(url: str, cases: int = 1000, concurrency: int = 8) -> FuzzReport:
    """``cases`` hypothesis-made requests to ``/v1/completions``, ``/v1/chat/completions`` and
    ``/generate`` (see the field table above), ``concurrency`` at a time, each judged by
    :func:`judge`. Then the server must be alive, idle with no KV page held, and answer the
    probe prompt with the same greedy tokens as before.

    The cases are drawn first and then sent concurrently (hypothesis runs one example at a time,
    and one at a time the engine never batches): so a failure is reported as the case that
    broke a rule, the smallest ones first, without hypothesis's shrinking."""
    report = FuzzReport("schema_fuzz")
    statuses: Counter[str] = Counter()
    failures: list[tuple[int, str]] = []
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=60, headers={"content-type": "application/json"},
                                 limits=httpx.Limits(max_connections=concurrency)) as client:
        served = (await client.get(f"{url}/v1/models", timeout=10)).json()["data"][0]["id"]
        drawn = await asyncio.to_thread(draw_fuzz_cases, served, cases)
        before = await greedy_ids(client, url, PROBE_PROMPT, 16)
        gate = asyncio.Semaphore(concurrency)

        async def send(case: FuzzCase) -> None:
            async with gate:
                try:
                    r = await client.post(url + case.path, content=case.raw)
                except httpx.HTTPError as exc:  # the server died, or broke the connection
                    statuses[type(exc).__name__] += 1
                    failures.append((len(case.raw), f"{case.path} {case.raw[:500]!r}: {type(exc).__name__}: {exc}"))
                    return
            error_event = r.status_code == 200 and stream_error_event(r)
            statuses[f"{r.status_code}+error" if error_event else str(r.status_code)] += 1
            if problem := judge(case, r):
                failures.append((len(case.raw), f"{case.path} {case.raw[:500]!r}: {problem}"))

        await asyncio.gather(*(send(case) for case in drawn))
        report.pool = await settle(url)
        try:
            report.alive = (await client.get(f"{url}/health", timeout=10)).status_code == 200
            report.same_tokens = await greedy_ids(client, url, PROBE_PROMPT, 16) == before
        except httpx.HTTPError:
            report.alive = False
    kinds = Counter(case.kind for case in drawn)
    report.cases, report.failed_cases = len(drawn), len(failures)
    report.valid_cases, report.invalid_cases, report.edge_cases = kinds["valid"], kinds["invalid"], kinds["edge"]
    report.statuses = dict(sorted(statuses.items()))
    report.failures = [message for _, message in sorted(failures)[:5]]
    report.seconds = time.monotonic() - start
    return report


# --- 5. malformed inputs ----------------------------------------------------------------------------
def _big_body(size: int) -> bytes:
    """A JSON object of ``size`` bytes (a long prompt)."""
    head, tail = b'{"max_tokens": 1, "prompt": "', b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


async def _chunked(data: bytes, piece: int = 256 * 1024) -> AsyncIterator[bytes]:
    """``data`` as an upload without Content-Length (``Transfer-Encoding: chunked``)."""
    for i in range(0, len(data), piece):
        yield data[i:i + piece]


def malformed_cases() -> list[tuple[str, str, str, Any]]:
    """``(name, method, path, body)``: each must get a 4xx with an OpenAI error body. ``body`` is
    raw bytes, or a callable that returns an async iterator (a chunked upload)."""
    from minisgl.server.api import MAX_BODY_BYTES

    big = _big_body(MAX_BODY_BYTES + 1024)
    c, chat, gen = "/v1/completions", "/v1/chat/completions", "/generate"
    return [
        ("truncated JSON", "POST", c, b'{"prompt": "Hi", "max_tokens": 2'),
        ("not JSON", "POST", c, b"{not json"),
        ("empty body", "POST", chat, b""),
        ("trailing garbage", "POST", c, b'{"prompt": "Hi", "max_tokens": 2} x'),
        ("top-level list", "POST", c, b'[{"prompt": "Hi"}]'),
        ("top-level number", "POST", chat, b"42"),
        ("top-level string", "POST", gen, b'"Hello"'),
        ("top-level null", "POST", gen, b"null"),
        ("invalid UTF-8 in a string", "POST", c, b'{"prompt": "Hi \xff\xfe", "max_tokens": 2}'),
        ("invalid UTF-8 body", "POST", chat, b"\xc3\x28\xa0\xa1"),
        ("lone surrogate escape", "POST", c, b'{"prompt": "Hi \\ud800", "max_tokens": 2}'),
        ("lone surrogate in a chat", "POST", chat, b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}'),
        ("lone surrogate stop string", "POST", gen,
         b'{"text": "Hi", "sampling_params": {"max_new_tokens": 2, "stop": ["\\ud800"]}}'),
        ("NaN literal", "POST", c, b'{"prompt": "Hi", "max_tokens": 2, "temperature": NaN}'),
        ("Infinity max_tokens", "POST", c, b'{"prompt": "Hi", "max_tokens": Infinity}'),
        ("100,000 nested lists", "POST", c, b"[" * 100_000),
        ("nesting inside a field", "POST", c, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("a 5,000-digit integer", "POST", c, b'{"prompt": "Hi", "max_tokens": 1' + b"0" * 5000 + b"}"),
        ("max_tokens 1e30", "POST", c, b'{"prompt": "Hi", "max_tokens": 1e30}'),
        ("max_tokens -1", "POST", chat, b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": -1}'),
        ("max_tokens 2**63", "POST", c, b'{"prompt": "Hi", "max_tokens": 9223372036854775808}'),
        ("max_tokens 2**64", "POST", gen, b'{"text": "Hi", "sampling_params": {"max_new_tokens": 18446744073709551616}}'),
        ("max_tokens a string", "POST", c, b'{"prompt": "Hi", "max_tokens": "lots"}'),
        ("temperature 10**400", "POST", c, b'{"prompt": "Hi", "max_tokens": 2, "temperature": 1' + b"0" * 400 + b"}"),
        ("top_k 2**63", "POST", c, b'{"prompt": "Hi", "max_tokens": 2, "temperature": 1, "top_k": 9223372036854775808}'),
        ("top_p 1e-50 (0 in float32)", "POST", c, b'{"prompt": "Hi", "max_tokens": 2, "temperature": 1, "top_p": 1e-50}'),
        ("token id 2**64", "POST", c, b'{"prompt": [18446744073709551616], "max_tokens": 2}'),
        ("token id 2**64, streamed", "POST", c, b'{"prompt": [18446744073709551616], "max_tokens": 2, "stream": true}'),
        ("empty messages", "POST", chat, b'{"messages": [], "max_tokens": 2}'),
        ("messages missing", "POST", chat, b'{"max_tokens": 2}'),
        ("a message without content", "POST", chat, b'{"messages": [{"role": "user"}], "max_tokens": 2}'),
        ("huge body, Content-Length", "POST", c, big),
        ("huge body, chunked", "POST", chat, lambda: _chunked(big)),
        ("OPTIONS on an endpoint", "OPTIONS", c, b""),
        ("DELETE on an endpoint", "DELETE", c, b""),
    ]


@dataclass
class MalformedReport(Report):
    cases: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # per case name
    failures: list[str] = field(default_factory=list)
    alive: bool = False

    def problems(self) -> list[str]:
        return self.failures + ([] if self.alive else ["the server is not alive afterwards"])


async def malformed_inputs(url: str) -> MalformedReport:
    """Every :func:`malformed_cases` body: a 4xx with an error body each; the server alive and
    answering afterwards."""
    report = MalformedReport("malformed_inputs")
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=60, headers={"content-type": "application/json"}) as client:
        for name, method, path, body in malformed_cases():
            report.cases += 1
            content = body() if callable(body) else body
            try:
                r = await client.request(method, url + path, content=content)
            except httpx.HTTPError as exc:
                report.statuses[name] = type(exc).__name__
                report.failures.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            report.statuses[name] = str(r.status_code)
            if not 400 <= r.status_code < 500:
                report.failures.append(f"{name}: status {r.status_code}: {r.text[:200]}")
            elif problem := response_error_problem(r):
                report.failures.append(f"{name}: {problem}")
        try:
            report.alive = len(await greedy_ids(client, url, PROBE_PROMPT, 4)) == 4
        except httpx.HTTPError:
            report.alive = False
    report.seconds = time.monotonic() - start
    return report


# --- 6. slow client ---------------------------------------------------------------------------------
@dataclass
class SlowClientReport(Report):
    others: int = 0
    baseline_s: float = 0.0  # the others, beside the same long stream read at full speed
    with_slow_s: float = 0.0  # the same others while the slow client reads nothing
    others_same_tokens: bool = False
    stall_s: float = 0.0  # how long the slow client read nothing
    engine_done_while_stalled: bool = False  # its request finished in the engine meanwhile
    slow_events: int = 0
    slow_bytes: int = 0
    slow_correct: bool = False  # its tokens equal those of the same stream read at full speed
    gone_running: bool = False  # a second stalled client hung up while its request still ran...
    gone_aborted: bool = False  # ...and the request was aborted
    pool: Pool = field(default_factory=Pool)

    @property
    def ratio(self) -> float:
        return self.with_slow_s / self.baseline_s if self.baseline_s else math.inf

    def problems(self) -> list[str]:
        out = []
        if self.with_slow_s > max(2 * self.baseline_s, self.baseline_s + 1.0):
            out.append(f"the other requests took {self.with_slow_s:.2f} s with a stalled reader, "
                       f"{self.baseline_s:.2f} s without ({self.ratio:.1f}x)")
        if not self.others_same_tokens:
            out.append("the other requests got other tokens with the slow reader present")
        if not self.engine_done_while_stalled:
            out.append("the stalled stream's request did not finish in the engine while its client read nothing")
        if not self.slow_correct:
            out.append("the slow stream's tokens are not the request's tokens")
        if self.gone_running and not self.gone_aborted:
            out.append("a stalled client that hung up was not counted as aborted")
        return out + self.pool.problems()


async def slow_client(url: str, others: int = 8, other_tokens: int = 32, slow_tokens: int = LONG_TOKENS,
                      recv_buffer: int = 65536, read_delay_s: float = 0.002) -> SlowClientReport:
    """A ``/generate`` stream whose client has a ``recv_buffer``-byte receive buffer reads one
    event, then nothing while ``others`` concurrent requests run (and until its own request has
    finished in the engine), then the rest one event every ``read_delay_s``. The others must take
    about as long (< 2x, or +1 s), and get the same tokens, as beside the same stream read at
    full speed: the baseline has the same extra request in the batch, so only the stall differs.
    The slow stream must carry exactly the tokens of the stream read at full speed; a second
    stalled client that hangs up while its request runs must be aborted.

    The receive buffer is far smaller than the answer (``/generate`` streams the cumulative
    answer: about 645 KB of events for 400 tokens), so the stall backs the answer up into the
    server. A 4 KB buffer did that no better, but draining 645 KB through a 4 KB TCP window
    (delayed ACKs on loopback) took 20 s after the stall; 64 KB drains it in a second.

    Where the unread answer waits: the engine hands every chunk to the API process, whose
    pump puts it in the request's unbounded ``asyncio.Queue`` (it never waits for a reader); the
    handler writes each event to the socket, and the kernel's send buffer (about 4 MB on
    loopback, autotuned) takes what the client does not read. Only past that would uvicorn pause
    the handler (``drain``), and still only that handler."""
    report = SlowClientReport("slow_client", others=others)
    prompts = [f"Other request {i}" for i in range(others)]
    slow_body = stream_body("generate", "A slow reader asks for a long answer", slow_tokens)
    small_buffer = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)])
    start = time.monotonic()

    async def run_others(client: httpx.AsyncClient) -> tuple[float, list[list[int]]]:
        t = time.monotonic()
        ids = await asyncio.gather(*(greedy_ids(client, url, p, other_tokens) for p in prompts))
        return time.monotonic() - t, ids

    async def engine_idle(client: httpx.AsyncClient, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = await fetch_metrics(client, url)
            if m["minisgl_num_running_requests"] == 0 and m["minisgl_num_waiting_requests"] == 0:
                return True
            await asyncio.sleep(0.05)
        return False

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=others + 2)) as client, \
            httpx.AsyncClient(transport=small_buffer, timeout=120) as slow:
        started = asyncio.Event()

        async def read_at_full_speed() -> list[int]:
            ids: list[int] = []
            async with client.stream("POST", f"{url}/generate", json=slow_body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        ids = json.loads(line[6:])["output_ids"]  # cumulative: the answer so far
                        started.set()
            return ids

        reader = asyncio.create_task(read_at_full_speed())
        await started.wait()
        report.baseline_s, baseline_ids = await run_others(client)
        reference = await reader
        ids: list[int] = []
        async with slow.stream("POST", f"{url}/generate", json=slow_body) as r:
            # One iterator for the whole stream: an async generator dropped after `break` is
            # closed by the garbage collector, and that closes the connection (a hang-up).
            lines = r.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    ids = json.loads(line[6:])["output_ids"]  # cumulative: the answer so far
                    report.slow_events += 1
                    report.slow_bytes += len(line)
                    break
            stalled = time.monotonic()
            report.with_slow_s, with_slow_ids = await run_others(client)
            report.others_same_tokens = with_slow_ids == baseline_ids
            report.engine_done_while_stalled = await engine_idle(client)
            report.stall_s = time.monotonic() - stalled
            async for line in lines:
                if line.startswith("data: {"):
                    ids = json.loads(line[6:])["output_ids"]  # cumulative: the answer so far
                    report.slow_events += 1
                    report.slow_bytes += len(line)
                    await asyncio.sleep(read_delay_s)
        report.slow_correct = ids == reference and len(ids) == slow_tokens

        # The same stall, but the client hangs up instead of reading on: an abort, no leak.
        aborted_before = (await fetch_metrics(client, url)).get(ABORTED, 0.0)
        async with slow.stream("POST", f"{url}/generate", json=slow_body) as r:
            lines = r.aiter_lines()  # kept (see above)
            async for line in lines:
                if line.startswith("data: {"):
                    break
            await asyncio.sleep(0.05)  # stalled
            report.gone_running = (await fetch_metrics(client, url))["minisgl_num_running_requests"] > 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not report.gone_aborted:
            report.gone_aborted = (await fetch_metrics(client, url)).get(ABORTED, 0.0) > aborted_before
            await asyncio.sleep(0.05)
        report.pool = await settle(url)
    report.seconds = time.monotonic() - start
    return report


# --- the script -------------------------------------------------------------------------------------
def print_report(report: Report) -> None:
    problems = report.problems()
    print(f"\n== {report.scenario}: {'OK' if not problems else 'PROBLEMS'} ({report.seconds:.1f} s)")
    for key, value in dataclasses.asdict(report).items():
        if key not in ("scenario", "seconds"):
            print(f"   {key}: {value}")
    for p in problems:
        print(f"   !! {p}")


@dataclass
class Crashed(Report):
    """A scenario that raised instead of reporting (the server died under it, say)."""

    error: str = ""

    def problems(self) -> list[str]:
        return [f"the scenario raised {self.error}"]


async def run_all(url: str | None, small_pool_url: str | None, model: str | None, device: str, scale: int,
                  on_report: Callable[[Report], None]) -> list[Report]:
    """Every scenario at ``scale`` times the test sizes, against ``url`` (and ``small_pool_url``)
    or servers started here."""
    reports: list[Report] = []

    async def record(scenario: Awaitable[Report]) -> None:
        start = time.monotonic()
        try:
            reports.append(await scenario)
        except Exception as exc:  # report it and go on with the next scenario
            name = getattr(scenario, "__name__", "scenario")
            reports.append(Crashed(name, time.monotonic() - start, f"{type(exc).__name__}: {exc}"))
        on_report(reports[-1])

    async def shared(base: str) -> None:
        await record(abort_storm(base, requests=200 * scale))
        await record(schema_fuzz(base, cases=1000 * scale))
        await record(malformed_inputs(base))
        await record(slow_client(base, others=8 * scale))

    if url is not None:
        await shared(url)
        if small_pool_url is not None:
            await record(over_capacity(small_pool_url, requests=24 * scale))
        return reports
    with ServerProcess(model, "--page-size", "4", device=device) as server:
        await shared(server.url)
    with ServerProcess(model, *OVER_CAPACITY_FLAGS, device=device) as server:
        await record(over_capacity(server.url, requests=24 * scale))
    with ServerProcess(model, device=device) as server:
        await record(sigterm_under_load(server, streams=16 * scale))
    return reports


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.tools.load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="attack this server (default: start python -m minisgl here)")
    p.add_argument("--small-pool-url", default=None,
                   help="with --base-url: a server with a small KV pool for the over-capacity scenario")
    p.add_argument("--model", default=None, help="checkpoint for the servers started here (default: the tiny test one)")
    p.add_argument("--device", default="cpu", help="device of the servers started here (default: cpu)")
    p.add_argument("--scale", type=int, default=1, help="multiply the test sizes by this (default: 1)")
    p.add_argument("--out", default=None, help="also write the reports to this JSON file")
    a = p.parse_args(argv)
    if a.device == "cpu":
        # One OpenMP thread per server process unless told otherwise: the scheduler's default
        # of one per core, competing with the API and tokenizer processes and this client for
        # the same cores, made a 1-token request ~10x slower on a 2-core machine.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = a.model
    if model is None and a.base_url is None:
        from minisgl.testing.checkpoints import tiny_checkpoint

        model = str(tiny_checkpoint("qwen3"))
    base, small = (u.rstrip("/") if u else None for u in (a.base_url, a.small_pool_url))
    reports = asyncio.run(run_all(base, small, model, a.device, a.scale, print_report))
    if a.out:
        with open(a.out, "w") as f:
            json.dump([r.as_dict() for r in reports], f, indent=2, default=str)
    failed = [r.scenario for r in reports if r.problems()]
    print(f"\n{len(reports) - len(failed)} of {len(reports)} scenarios OK" + (f"; problems in {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
