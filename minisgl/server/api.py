"""Lesson 10: the HTTP front: FastAPI handlers for the OpenAI API, ``/generate``, ``/health``
and ``/metrics``.

Each request gets an id and an :class:`asyncio.Queue`. The handler sends a
:class:`GenerateRequest` to the tokenizer worker and then reads :class:`TextChunk` s from its
queue; one background task (:meth:`EngineClient.pump`) reads every chunk the tokenizer sends and
puts it in the right queue. Streaming handlers turn each chunk into one server-sent event.

A streamed request starts its response only once its first chunk is there, so a request
refused before its first token gets its 4xx as the HTTP status, streamed or not.

If the client goes away, the handler's ``finally`` sends an :class:`AbortRequest`: the request
stops running and its KV pages are freed. A streaming response notices the disconnect because
Starlette cancels the generator; before the response starts, and for a non-streaming request,
the handler polls ``request.is_disconnected()`` while it waits (:class:`DisconnectWatch`).
"""

from __future__ import annotations

__lesson__ = 10

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from minisgl.server.messages import (
    AbortRequest,
    ChunkBatch,
    FlushCache,
    FlushResult,
    GenerateRequest,
    Stats,
    TextChunk,
    TextLogprobs,
    decode,
    encode,
)
from minisgl.server.metrics import ServerMetrics
from minisgl.server.protocol import (
    REQUEST_MODELS,
    APIError,
    EngineCall,
    ParsedRequest,
    check_model,
    openapi_components,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_generate,
    parse_tokenize,
    usage,
)
from minisgl.tokenizer import encode_prompt, load_tokenizer

logger = logging.getLogger("minisgl.server")
DISCONNECT_POLL_S = 0.25
# A request's queue holds at most this many chunks; more are merged (see ChunkQueue).
MAX_PENDING_CHUNKS = 256
# The largest request body read. A prompt of a whole 40k-token context is well under 1 MiB of
# JSON (token ids or text); anything past this is refused with a 413 before it is all read.
MAX_BODY_BYTES = 8 * 1024 * 1024
# A \uD800-\uDFFF escape (a surrogate): the only way a JSON body can hold a string that is not
# Unicode text. A pair of them is one character; a lone one cannot be encoded (a 400).
LONE_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
# /flush_cache with ?timeout=S: how often it asks again while requests still run.
FLUSH_RETRY_S = 0.05


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


@dataclass
class DisconnectWatch:
    """Reads a request's chunks while checking, every :data:`DISCONNECT_POLL_S` by the clock,
    that its client is still there (a handler that has not started its response is not
    cancelled when the client goes: it has to ask)."""

    request: Request
    checked: float = field(default_factory=time.perf_counter)

    async def get(self, queue: asyncio.Queue[TextChunk]) -> TextChunk:
        """The next chunk; raises :class:`ClientGone` if the client disconnected meanwhile."""
        while True:
            # Chunks may come faster than the poll interval: check the clock, not just timeouts.
            if time.perf_counter() - self.checked >= DISCONNECT_POLL_S:
                self.checked = time.perf_counter()
                if await self.request.is_disconnected():
                    raise ClientGone
            try:
                return await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                continue


@dataclass
class Answer:
    """Everything a request produced, gathered from its chunks."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TextLogprobs] | None = None  # None unless the request asked

    def add(self, chunk: TextChunk) -> None:
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        if chunk.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(chunk.logprobs)
        self.finish_reason = chunk.finish_reason
        self.prompt_tokens, self.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        self.cached_tokens = chunk.cached_tokens


class ChunkQueue(asyncio.Queue):
    """A request's queue of chunks, bounded: past :data:`MAX_PENDING_CHUNKS` waiting chunks (a
    client that stopped reading its stream), a new chunk is merged into the last one (text, ids
    and logprobs appended, the newer counts and finish reason kept) instead of queued. The
    answer stays whole and exact; the memory a stalled stream holds is its text, not one
    object per token. An error chunk is never merged. Merging appends to lists (joined when the
    chunk is taken), so a long stall costs linear time, not quadratic."""

    def _put(self, item: TextChunk) -> None:
        queue = self._queue  # type: ignore[attr-defined]
        last = queue[-1] if len(queue) >= MAX_PENDING_CHUNKS else None
        if last is None or item.error is not None or last[0].error is not None or last[0].finish_reason is not None:
            queue.append((item, [item.text], list(item.token_ids), None if item.logprobs is None else list(item.logprobs)))
            return
        texts, ids, logprobs = last[1], last[2], last[3]
        texts.append(item.text)
        ids.extend(item.token_ids)
        if logprobs is not None and item.logprobs is not None:
            logprobs.extend(item.logprobs)
        queue[-1] = (item, texts, ids, logprobs)  # the newest chunk's counts and finish reason

    def _get(self) -> TextChunk:
        item, texts, ids, logprobs = self._queue.popleft()  # type: ignore[attr-defined]
        if len(texts) == 1:
            return item
        return dataclasses.replace(item, text="".join(texts), token_ids=ids, logprobs=logprobs)


class EngineClient:
    """The API process's side of the ZMQ sockets: send requests, route chunks to their queues."""

    def __init__(self, to_tokenizer: str, from_tokenizer: str, metrics: ServerMetrics) -> None:
        self.context = zmq.asyncio.Context()
        self.send_socket = self.context.socket(zmq.PUSH)
        self.send_socket.connect(to_tokenizer)
        self.recv_socket = self.context.socket(zmq.PULL)
        self.recv_socket.bind(from_tokenizer)
        self.queues: dict[str, asyncio.Queue[TextChunk]] = {}
        self.flushes: dict[str, asyncio.Future[FlushResult]] = {}  # /flush_cache calls waiting for their answer
        self.metrics = metrics

    async def pump(self) -> None:
        """Forever: route every incoming chunk to its request's queue (chunks of requests
        nobody waits for any more are dropped), and hand the engine's stats to the metrics."""
        while True:
            message = decode(await self.recv_socket.recv())
            if isinstance(message, FlushResult):
                if message.stats is not None:
                    self.metrics.set_engine_stats(Stats(*message.stats))
                future = self.flushes.get(message.fid)
                if future is not None and not future.done():
                    future.set_result(message)
                continue
            if not isinstance(message, ChunkBatch):
                continue
            if message.stats is not None:
                self.metrics.set_engine_stats(Stats(*message.stats))
            for fields in message.chunks:
                queue = self.queues.get(fields[0])  # fields[0] is the rid
                if queue is not None:
                    queue.put_nowait(TextChunk(*fields))

    async def submit(self, call: EngineCall) -> asyncio.Queue[TextChunk]:
        queue = ChunkQueue()
        self.queues[call.rid] = queue
        await self.send_socket.send(encode(GenerateRequest(call.rid, call.prompt, call.params)))
        return queue

    async def flush_cache(self) -> FlushResult:
        """Ask the scheduler (through the tokenizer worker) to empty the radix cache; its answer."""
        fid = uuid.uuid4().hex
        future = self.flushes[fid] = asyncio.get_running_loop().create_future()
        try:
            await self.send_socket.send(encode(FlushCache(fid)))
            return await future
        finally:
            self.flushes.pop(fid, None)

    async def release(self, rid: str, finished: bool) -> None:
        """The handler is done with ``rid``; abort it in the engine unless it finished."""
        self.queues.pop(rid, None)
        if not finished:
            await self.send_socket.send(encode(AbortRequest(rid)))

    def end_all(self, message: str) -> None:
        """Finish every request still waiting for chunks with a 503 ``message`` (the server is
        stopping): streams send it as their last event, then ``[DONE]``, and close cleanly."""
        for rid, queue in self.queues.items():
            queue.put_nowait(TextChunk(rid, "", [], "error", error=message, status=503))
        for future in self.flushes.values():
            if not future.done():
                future.set_exception(APIError(503, message, kind="server_error"))

    def close(self) -> None:
        self.send_socket.close(0)
        self.recv_socket.close(0)
        self.context.term()


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def chunk_error(chunk: TextChunk) -> APIError:
    return APIError(chunk.status, chunk.error or "the request failed",
                    kind="invalid_request_error" if chunk.status < 500 else "server_error")


async def read_json(request: Request) -> Any:
    """The body as JSON; a 415 for another Content-Type (none given: JSON assumed), a 400 if it is
    not valid UTF-8 JSON, a 413 past :data:`MAX_BODY_BYTES` (said by ``Content-Length`` or found
    while reading a chunked body, which stops there)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise APIError(415, f"the request body must be JSON (Content-Type: application/json), not {media!r}")
    too_big = APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise too_big
        parts.append(part)
    raw = b"".join(parts)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, a 5,000-digit number, too deep
        raise APIError(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if LONE_SURROGATE.search(raw):  # maybe a lone \ud800, which json.loads turns into a str that
        try:  # is no Unicode text: no UTF-8 can carry it to the tokenizer (nor back in an answer)
            json.dumps(body, ensure_ascii=False).encode()
        except (UnicodeEncodeError, RecursionError):
            raise APIError(400, "the request body has a lone UTF-16 surrogate escape (like \\ud800), "
                                "which is not a Unicode character") from None
    return body


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def event_head(fields: dict[str, Any], choice_start: str) -> str:
    """The start of a stream event, the same for every token of a request, built once:
    ``data: {"id": ..., ..., <choice_start>``. :func:`event_tail` closes it."""
    return "data: " + json.dumps(fields, ensure_ascii=False)[:-1] + ", " + choice_start


def event_tail(chunk: TextChunk, logprobs: dict[str, Any] | None = None) -> str:
    reason = "null" if chunk.finish_reason is None else f'"{chunk.finish_reason}"'
    shown = "null" if logprobs is None else json.dumps(logprobs, ensure_ascii=False)
    return f', "logprobs": {shown}, "finish_reason": {reason}}}]}}\n\n'


def completion_logprobs(entries: list[TextLogprobs], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy (``/v1/completions``) ``logprobs`` of ``entries``: per token its text, its
    logprob, the most likely tokens as ``{text: logprob}`` (with the chosen token added when it
    is not among them, as OpenAI does: up to ``logprobs + 1`` keys) and where its text starts in
    the answer's text, the first at ``offset`` (a stream's chunk continues the answer so far)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, logprob, top in entries:
        best: dict[str, float] = {}
        for text, value in top:  # best first: two tokens with the same text keep the likelier
            best.setdefault(text, value)
        best.setdefault(token, logprob)
        out["tokens"].append(token)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(best)
        out["text_offset"].append(offset)
        offset += len(token)
    return out


def chat_logprobs(entries: list[TextLogprobs]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` of ``entries``: per token its text, logprob and UTF-8 bytes, and
    its ``top_logprobs`` (the most likely tokens, best first, as many as asked) in the same form."""
    def item(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**item(token, logprob), "top_logprobs": [item(t, v) for t, v in top]}
                        for token, logprob, top in entries], "refusal": None}


class APIKeyCheck:
    """ASGI middleware: every path but ``/health`` needs ``Authorization: Bearer <key>``.

    The comparison takes the same time whatever the first wrong character (``hmac.compare_digest``),
    so the key cannot be guessed one character at a time by timing answers. A plain ASGI class, not
    ``@app.middleware("http")``: behind that wrapper, ``request.is_disconnected()`` stayed False
    after the client had gone (Starlette 1.10), and aborts never happened."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_response(APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                                                   kind="authentication_error", code="invalid_api_key"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


FLUSH_CACHE_DOC: dict[str, Any] = {
    "parameters": [{"name": "timeout", "in": "query", "required": False,
                    "schema": {"type": "number", "minimum": 0, "default": 0},
                    "description": "seconds to wait for running and waiting requests to finish before refusing"}],
    "responses": {"400": {"description": "requests are running or waiting (OpenAI error body)"}},
}


def flush_timeout(raw: str | None) -> float:
    """``/flush_cache``'s ``timeout`` query parameter: a finite number of seconds >= 0 (0 if absent)."""
    try:
        value = 0.0 if raw is None else float(raw)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise APIError(400, f"timeout must be a finite number of seconds >= 0, not {raw[:50]!r}", "timeout")
    return value


def request_body(path: str) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a POST ``path``: its model in :data:`REQUEST_MODELS`."""
    name = REQUEST_MODELS[path].__name__
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}}


def create_app(client: EngineClient, model_name: str, api_key: str | None = None,
               on_startup: Callable[[], None] | None = None, max_model_len: int | None = None,
               tokenizer_source: str | None = None) -> FastAPI:
    """The FastAPI app over ``client``. ``model_name`` is what ``/v1/models`` lists and what
    requests may name; ``max_model_len`` (prompt + max_tokens of one request) is listed with it.
    ``tokenizer_source`` (the model's path or id) serves ``/tokenize`` and ``/detokenize``; its
    tokenizer is loaded on their first call."""
    metrics = client.metrics
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        pump = asyncio.get_running_loop().create_task(client.pump())  # routes chunks while we serve
        if on_startup is not None:
            on_startup()
        yield
        pump.cancel()

    app = FastAPI(title="minisgl", docs_url=None, redoc_url=None, lifespan=lifespan)

    def openapi() -> dict[str, Any]:
        """FastAPI's document, with the request models of ``protocol`` as its schemas (the
        handlers read the body themselves, for the 413/415 checks, so FastAPI cannot see them)."""
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(openapi_components(model_name, max_model_len))
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own errors (a 405 for OPTIONS /v1/completions) get OpenAI's error body too."""
        response = error_response(APIError(exc.status_code, str(exc.detail)))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s", request.url.path)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}", kind="server_error"))

    if api_key is not None:
        app.add_middleware(APIKeyCheck, api_key=api_key)

    async def run_one(call: EngineCall, request: Request) -> Answer:
        """Submit one engine request and wait for its whole answer, aborting if the client disconnects."""
        queue = await client.submit(call)
        answer, finished, start = Answer(), False, time.perf_counter()
        watch = DisconnectWatch(request)
        try:
            while not finished:
                chunk = await watch.get(queue)
                if chunk.finish_reason == "error":
                    finished = True
                    raise chunk_error(chunk)
                metrics.on_token(call.rid, start)
                answer.add(chunk)
                finished = chunk.finish_reason is not None
            return answer
        finally:
            metrics.on_finish(call.rid, answer.finish_reason if finished else "abort", answer.prompt_tokens,
                              answer.completion_tokens, answer.cached_tokens, start)
            await client.release(call.rid, finished)

    async def run(parsed: ParsedRequest, request: Request) -> list[Answer]:
        """Every answer of ``parsed``, in choice order. If one fails, the others are aborted (their
        KV freed) and the request gets that one's error."""
        tasks = [asyncio.ensure_future(run_one(call, request)) for call in parsed.calls()]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()  # no-op for the finished ones
            await asyncio.gather(*tasks, return_exceptions=True)  # let each release its request

    async def open_stream(parsed: ParsedRequest, request: Request, render: Callable[[TextChunk, bool, int], str],
                          final_usage: Callable[[list[Answer]], dict] | None) -> Response:
        """Submit a streamed request's engine requests and wait for the first chunk of each before
        answering. A request refused before its first token (too long for the context, a token id
        outside the vocabulary) then gets its 4xx as the HTTP status, as it would without
        streaming, rather than a 200 whose only event is an error."""
        calls = parsed.calls()
        queues = [await client.submit(call) for call in calls]
        start = time.perf_counter()
        firsts: list[TextChunk] = []

        async def give_up() -> None:
            """Release every answer; abort those still running (all but the ended ones)."""
            for i, call in enumerate(calls):
                ended = i < len(firsts) and firsts[i].finish_reason is not None
                metrics.on_finish(call.rid, None if ended else "abort", 0, 0, 0, start)
                await client.release(call.rid, ended)

        watch = DisconnectWatch(request)
        try:
            for queue in queues:
                firsts.append(await watch.get(queue))
                if firsts[-1].finish_reason == "error":  # one answer refused: the others must stop
                    break
        except BaseException:  # the client went away (or we are cancelled) before the first tokens
            await give_up()
            raise
        if firsts[-1].finish_reason == "error":
            await give_up()
            raise chunk_error(firsts[-1])
        return StreamingResponse(stream(calls, queues, firsts, start, render, final_usage, parsed.include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def stream(calls: list[EngineCall], queues: list[asyncio.Queue[TextChunk]], firsts: list[TextChunk],
                     start: float, render: Callable[[TextChunk, bool, int], str],
                     final_usage: Callable[[list[Answer]], dict] | None, include_usage: bool) -> AsyncIterator[str]:
        """One event per chunk (``render(chunk, first, index)``), the usage event if asked, ``[DONE]``.

        Several answers (``n``, a batch of prompts) are merged into one stream, each event
        carrying its choice's index. Chunks that are already waiting when the previous write is
        done go out in one write (still one event each): under load, this is what keeps the
        HTTP side up with the engine."""
        merged: asyncio.Queue[tuple[int, TextChunk]] = asyncio.Queue()
        for i, chunk in enumerate(firsts):
            merged.put_nowait((i, chunk))

        async def forward(i: int) -> None:  # one answer's chunks, after its first, into the merged queue
            if firsts[i].finish_reason is not None:
                return
            while True:
                chunk = await queues[i].get()
                merged.put_nowait((i, chunk))
                if chunk.finish_reason is not None:
                    return

        forwarders = [asyncio.ensure_future(forward(i)) for i in range(len(calls))]
        answers = [Answer() for _ in calls]
        finished, started = [False] * len(calls), [False] * len(calls)
        failed = False
        try:
            while not failed and not all(finished):
                items = [await merged.get()]
                while not merged.empty():
                    items.append(merged.get_nowait())
                events = []
                for i, chunk in items:
                    if chunk.finish_reason == "error":
                        failed = finished[i] = True
                        events.append(sse(chunk_error(chunk).body()))
                        break
                    metrics.on_token(calls[i].rid, start)
                    answers[i].add(chunk)
                    finished[i] = chunk.finish_reason is not None
                    events.append(render(chunk, not started[i], i))
                    started[i] = True
                yield "".join(events)
            if not failed and include_usage and final_usage is not None:
                yield sse(final_usage(answers))
            yield sse("[DONE]")
        finally:  # also when Starlette cancels us because the client went away
            for task in forwarders:
                task.cancel()
            for call, answer, done in zip(calls, answers, finished):
                metrics.on_finish(call.rid, answer.finish_reason if done else "abort", answer.prompt_tokens,
                                  answer.completion_tokens, answer.cached_tokens, start)
                await client.release(call.rid, done)

    def total_usage(parsed: ParsedRequest, answers: list[Answer]) -> dict[str, Any]:
        """Usage over every answer: each prompt's tokens counted once (as OpenAI counts them for ``n``)."""
        per_prompt = answers[:: parsed.n]
        return usage(sum(a.prompt_tokens for a in per_prompt), sum(a.completion_tokens for a in answers),
                     sum(a.cached_tokens for a in per_prompt))

    async def unless_gone(work: Awaitable[Any]) -> Any:
        """``await work`` (:func:`run` or :func:`open_stream`), or a 499 if the client left first."""
        try:
            return await work
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"

    @app.post("/v1/chat/completions", openapi_extra=request_body("/v1/chat/completions"))
    async def chat_completions(request: Request):
        parsed = parse_chat(await read_json(request), model_name)
        cid = f"chatcmpl-{parsed.rid}"

        def base(object_: str) -> dict[str, Any]:
            return {"id": cid, "object": object_, "created": parsed.created, "model": model_name}

        if parsed.stream:
            heads = [event_head(base("chat.completion.chunk"), f'"choices": [{{"index": {i}, "delta": {{')
                     for i in range(len(parsed.prompts) * parsed.n)]

            def render(chunk: TextChunk, first: bool, index: int) -> str:
                role = '"role": "assistant", ' if first else ""
                logprobs = None if chunk.logprobs is None else chat_logprobs(chunk.logprobs)
                return (f'{heads[index]}{role}"content": {json.dumps(chunk.text, ensure_ascii=False)}}}'
                        f'{event_tail(chunk, logprobs)}')

            def final(answers: list[Answer]) -> dict:
                return {**base("chat.completion.chunk"), "choices": [], "usage": total_usage(parsed, answers)}

            return await unless_gone(open_stream(parsed, request, render, final))
        answers = await unless_gone(run(parsed, request))
        if isinstance(answers, Response):
            return answers
        return {**base("chat.completion"),
                "choices": [{"index": i, "message": {"role": "assistant", "content": a.text},
                             "logprobs": None if a.logprobs is None else chat_logprobs(a.logprobs),
                             "finish_reason": a.finish_reason} for i, a in enumerate(answers)],
                "usage": total_usage(parsed, answers)}

    @app.post("/v1/completions", openapi_extra=request_body("/v1/completions"))
    async def completions(request: Request):
        parsed = parse_completion(await read_json(request), model_name)
        cid = f"cmpl-{parsed.rid}"

        def base() -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": parsed.created, "model": model_name}

        if parsed.stream:
            heads = [event_head(base(), f'"choices": [{{"index": {i}, "text": ')
                     for i in range(len(parsed.prompts) * parsed.n)]
            offsets = [0] * len(heads)  # each answer's text so far, as its logprobs' tokens spell it

            def render(chunk: TextChunk, first: bool, index: int) -> str:
                logprobs = None
                if chunk.logprobs is not None:
                    logprobs = completion_logprobs(chunk.logprobs, offsets[index])
                    offsets[index] += sum(len(entry[0]) for entry in chunk.logprobs)
                return f"{heads[index]}{json.dumps(chunk.text, ensure_ascii=False)}{event_tail(chunk, logprobs)}"

            def final(answers: list[Answer]) -> dict:
                return {**base(), "choices": [], "usage": total_usage(parsed, answers)}

            return await unless_gone(open_stream(parsed, request, render, final))
        answers = await unless_gone(run(parsed, request))
        if isinstance(answers, Response):
            return answers
        return {**base(), "choices": [{"index": i, "text": a.text,
                                       "logprobs": None if a.logprobs is None else completion_logprobs(a.logprobs),
                                       "finish_reason": a.finish_reason} for i, a in enumerate(answers)],
                "usage": total_usage(parsed, answers)}

    @app.post("/generate", openapi_extra=request_body("/generate"))
    async def generate(request: Request):
        parsed = parse_generate(await read_json(request))

        def meta(answer_or_chunk) -> dict[str, Any]:
            return {"prompt_tokens": answer_or_chunk.prompt_tokens, "completion_tokens": answer_or_chunk.completion_tokens,
                    "cached_tokens": answer_or_chunk.cached_tokens, "finish_reason": answer_or_chunk.finish_reason}

        if parsed.stream:
            # As SGLang's native API does, every event carries the whole answer so far (text and
            # ids): a client keeps the last event, and SGLang's own clients read it that way.
            so_far = Answer()

            def render(chunk: TextChunk, first: bool, index: int) -> str:
                so_far.add(chunk)
                return sse({"text": so_far.text, "output_ids": so_far.token_ids, "meta_info": meta(chunk)})

            return await unless_gone(open_stream(parsed, request, render, None))
        answers = await unless_gone(run(parsed, request))
        if isinstance(answers, Response):
            return answers
        return {"text": answers[0].text, "output_ids": answers[0].token_ids, "meta_info": meta(answers[0])}

    model_card = {"id": model_name, "object": "model", "created": 0, "owned_by": "minisgl"}
    if max_model_len is not None:
        model_card["max_model_len"] = max_model_len

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model({"model": model_id}, model_name)  # a 404 naming the model we serve
        return model_card

    tokenizers: dict[str, Any] = {}

    async def tokenizer() -> Any:
        if tokenizer_source is None:
            raise APIError(404, "this server has no tokenizer endpoints", kind="not_found_error")
        if "tok" not in tokenizers:  # loaded once, off the event loop
            tokenizers["tok"] = await asyncio.to_thread(load_tokenizer, tokenizer_source)
        return tokenizers["tok"]

    @app.post("/tokenize", openapi_extra=request_body("/tokenize"))
    async def tokenize(request: Request):
        """The token ids a completion (``prompt``) or chat (``messages``) request starts from."""
        prompt = parse_tokenize(await read_json(request), model_name)
        tok = await tokenizer()
        try:
            ids = encode_prompt(tok, prompt)
        except Exception as exc:  # a chat template refusing the conversation
            raise APIError(400, f"the prompt cannot be tokenized: {exc}"[:500], "messages") from None
        return {"tokens": ids, "count": len(ids), "max_model_len": max_model_len}

    @app.post("/detokenize", openapi_extra=request_body("/detokenize"))
    async def detokenize(request: Request):
        body = await read_json(request)
        tok = await tokenizer()
        ids = parse_detokenize(body, model_name, len(tok))
        return {"prompt": tok.decode(ids)}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/flush_cache", response_class=PlainTextResponse, openapi_extra=FLUSH_CACHE_DOC)
    @app.post("/flush_cache", response_class=PlainTextResponse, openapi_extra=FLUSH_CACHE_DOC)
    async def flush_cache(request: Request):
        """Empty the radix (prefix) cache, as SGLang's ``/flush_cache`` does (benchmark clients
        call it before a run): only while no request runs or waits. ``?timeout=S`` waits up to S
        seconds for the engine to become idle. 200 with a plain-text body when flushed; while
        requests run, a 400 with an OpenAI error body (SGLang answers 400 too, so a client written
        for it behaves the same here)."""
        timeout = flush_timeout(request.query_params.get("timeout"))
        deadline = time.monotonic() + timeout
        while True:
            result = await client.flush_cache()
            if result.ok or time.monotonic() >= deadline:
                break
            if await request.is_disconnected():
                return Response(status_code=499)
            await asyncio.sleep(min(FLUSH_RETRY_S, max(0.0, deadline - time.monotonic())))
        if not result.ok:
            raise APIError(400, result.message, code="engine_busy")
        metrics.cache_flushes.inc()
        return PlainTextResponse(f"Cache flushed.\n{result.message}\n")

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
    async def not_found(path: str):
        raise APIError(404, f"no route /{path}", kind="not_found_error")

    return app
