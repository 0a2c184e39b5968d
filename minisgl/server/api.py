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
import functools
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
from pydantic import BaseModel
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
    ChatResponse,
    CompletionResponse,
    DetokenizeResponse,
    EngineCall,
    ErrorResponse,
    GenerateResponse,
    ModelCard,
    ModelList,
    ParsedRequest,
    TokenizeResponse,
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
    """OpenAI's legacy (``/v1/completions``) ``logprobs`` of ``entries``: per token its name, its
    logprob, the most likely tokens as ``{name: logprob}`` (a name per token, so as many keys as
    asked, and the chosen token added when it is not among them, as OpenAI does: then
    ``logprobs + 1``) and where its text starts in the answer's text, the first at ``offset`` (a
    stream's chunk continues the answer so far)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, logprob, top, text in entries:
        best: dict[str, float] = {}
        for name, value in top:  # best first (names are distinct; were two alike, the likelier stays)
            best.setdefault(name, value)
        best.setdefault(token, logprob)
        out["tokens"].append(token)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(best)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def token_bytes(name: str) -> list[int]:
    """The bytes of the token named ``name``: a piece of a character's own
    (``"bytes: \\xe4"``: ``[32, 228]``), any other token's the UTF-8 of its name."""
    escaped = name[6:] if name.startswith("bytes:") else None
    if escaped is None or not re.fullmatch(r"(?:[ -\[\]-~]|\\x[0-9a-f]{2})+", escaped):
        return list(name.encode())
    return list(re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), escaped).encode("latin-1"))


def chat_logprobs(entries: list[TextLogprobs]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` of ``entries``: per token its name, logprob and bytes, and its
    ``top_logprobs`` (the most likely tokens, best first, as many as asked) in the same form."""
    def item(name: str, logprob: float) -> dict[str, Any]:
        return {"token": name, "logprob": logprob, "bytes": token_bytes(name)}

    return {"content": [{**item(token, logprob), "top_logprobs": [item(t, v) for t, v in top]}
                        for token, logprob, top, _ in entries], "refusal": None}


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
    "responses": {"400": {"description": "requests are running or waiting (OpenAI error body)", "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorResponse.__name__}"}}}}},
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


Render = Callable[[TextChunk, bool, int], str]


def total_usage(parsed: ParsedRequest, answers: list[Answer]) -> dict[str, Any]:
    """Usage over every answer: each prompt's tokens counted once (as OpenAI counts them for ``n``)."""
    per_prompt = answers[:: parsed.n]
    return usage(sum(a.prompt_tokens for a in per_prompt), sum(a.completion_tokens for a in answers),
                 sum(a.cached_tokens for a in per_prompt))


async def unless_gone(work: Awaitable[Any]) -> Any:
    """``await work`` (:meth:`Endpoints.run` or :meth:`Endpoints.open_stream`), or a 499 if the
    client left first."""
    try:
        return await work
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"


class ChatShape:
    """``/v1/chat/completions``' answers in OpenAI's form: one ``chat.completion`` body, or one
    ``chat.completion.chunk`` event per chunk (each choice's first with the role)."""

    def __init__(self, parsed: ParsedRequest, model_name: str) -> None:
        self.parsed, self.model_name = parsed, model_name
        if parsed.stream:  # each choice's events start the same: built once
            self.heads = [event_head(self.base("chat.completion.chunk"), f'"choices": [{{"index": {i}, "delta": {{')
                          for i in range(len(parsed.prompts) * parsed.n)]

    def base(self, object_: str) -> dict[str, Any]:
        return {"id": f"chatcmpl-{self.parsed.rid}", "object": object_, "created": self.parsed.created,
                "model": self.model_name}

    def render(self, chunk: TextChunk, first: bool, index: int) -> str:
        """The event of one chunk of choice ``index``."""
        role = '"role": "assistant", ' if first else ""
        logprobs = None if chunk.logprobs is None else chat_logprobs(chunk.logprobs)
        return (f'{self.heads[index]}{role}"content": {json.dumps(chunk.text, ensure_ascii=False)}}}'
                f'{event_tail(chunk, logprobs)}')

    def final(self, answers: list[Answer]) -> dict[str, Any] | None:
        """The usage event that ends a stream (``stream_options.include_usage``)."""
        return {**self.base("chat.completion.chunk"), "choices": [], "usage": total_usage(self.parsed, answers)}

    def body(self, answers: list[Answer]) -> dict[str, Any]:
        """The whole (not streamed) response."""
        return {**self.base("chat.completion"),
                "choices": [{"index": i, "message": {"role": "assistant", "content": a.text},
                             "logprobs": None if a.logprobs is None else chat_logprobs(a.logprobs),
                             "finish_reason": a.finish_reason} for i, a in enumerate(answers)],
                "usage": total_usage(self.parsed, answers)}


class CompletionShape:
    """``/v1/completions``' answers in OpenAI's form: one ``text_completion`` body, or one event
    per chunk (its logprobs' ``text_offset`` continuing its choice's text so far)."""

    def __init__(self, parsed: ParsedRequest, model_name: str) -> None:
        self.parsed, self.model_name = parsed, model_name
        if parsed.stream:
            self.heads = [event_head(self.base(), f'"choices": [{{"index": {i}, "text": ')
                          for i in range(len(parsed.prompts) * parsed.n)]
            self.offsets = [0] * len(self.heads)  # each answer's text so far, as its logprobs' tokens added it

    def base(self) -> dict[str, Any]:
        return {"id": f"cmpl-{self.parsed.rid}", "object": "text_completion", "created": self.parsed.created,
                "model": self.model_name}

    def render(self, chunk: TextChunk, first: bool, index: int) -> str:
        """The event of one chunk of choice ``index``."""
        logprobs = None
        if chunk.logprobs is not None:
            logprobs = completion_logprobs(chunk.logprobs, self.offsets[index])
            self.offsets[index] += sum(len(entry[3]) for entry in chunk.logprobs)
        return f"{self.heads[index]}{json.dumps(chunk.text, ensure_ascii=False)}{event_tail(chunk, logprobs)}"

    def final(self, answers: list[Answer]) -> dict[str, Any] | None:
        """The usage event that ends a stream (``stream_options.include_usage``)."""
        return {**self.base(), "choices": [], "usage": total_usage(self.parsed, answers)}

    def body(self, answers: list[Answer]) -> dict[str, Any]:
        """The whole (not streamed) response."""
        return {**self.base(), "choices": [{"index": i, "text": a.text,
                                            "logprobs": None if a.logprobs is None else completion_logprobs(a.logprobs),
                                            "finish_reason": a.finish_reason} for i, a in enumerate(answers)],
                "usage": total_usage(self.parsed, answers)}


class GenerateShape:
    """``/generate``'s answer in SGLang's native form: ``text``, ``output_ids`` and ``meta_info``.
    As SGLang's native API does, every stream event carries the whole answer so far (text and
    ids): a client keeps the last event, and SGLang's own clients read it that way."""

    def __init__(self) -> None:
        self.so_far = Answer()

    @staticmethod
    def meta(answer_or_chunk: Answer | TextChunk) -> dict[str, Any]:
        return {"prompt_tokens": answer_or_chunk.prompt_tokens, "completion_tokens": answer_or_chunk.completion_tokens,
                "cached_tokens": answer_or_chunk.cached_tokens, "finish_reason": answer_or_chunk.finish_reason}

    def render(self, chunk: TextChunk, first: bool, index: int) -> str:
        """The event of one chunk: the answer so far."""
        self.so_far.add(chunk)
        return sse({"text": self.so_far.text, "output_ids": self.so_far.token_ids, "meta_info": self.meta(chunk)})

    def final(self, answers: list[Answer]) -> dict[str, Any] | None:
        """No usage event: the counts are in every event's ``meta_info``."""
        return None

    def body(self, answers: list[Answer]) -> dict[str, Any]:
        """The whole (not streamed) response."""
        return {"text": answers[0].text, "output_ids": answers[0].token_ids, "meta_info": self.meta(answers[0])}


Shape = ChatShape | CompletionShape | GenerateShape


class Endpoints:
    """The handlers, and what they share: the engine client, its metrics, the model's name and
    card, and the tokenizer of ``/tokenize`` and ``/detokenize`` (loaded on first use)."""

    def __init__(self, client: EngineClient, model_name: str, max_model_len: int | None = None,
                 tokenizer_source: str | None = None) -> None:
        self.client, self.metrics = client, client.metrics
        self.model_name, self.max_model_len, self.tokenizer_source = model_name, max_model_len, tokenizer_source
        self.model_card: dict[str, Any] = {"id": model_name, "object": "model", "created": 0, "owned_by": "minisgl"}
        if max_model_len is not None:
            self.model_card["max_model_len"] = max_model_len
        self._tokenizer: Any = None

    # -- running requests: shared by the three generating endpoints --

    async def respond(self, parsed: ParsedRequest, request: Request, shape: Shape) -> Any:
        """The response to a generating request: its stream, or its body once every answer is
        in; a 499 if the client left first."""
        if parsed.stream:
            return await unless_gone(self.open_stream(parsed, request, shape.render, shape.final))
        answers = await unless_gone(self.run(parsed, request))
        if isinstance(answers, Response):
            return answers
        return shape.body(answers)

    async def run_one(self, call: EngineCall, request: Request) -> Answer:
        """Submit one engine request and wait for its whole answer, aborting if the client disconnects."""
        queue = await self.client.submit(call)
        answer, finished, start = Answer(), False, time.perf_counter()
        watch = DisconnectWatch(request)
        try:
            while not finished:
                chunk = await watch.get(queue)
                if chunk.finish_reason == "error":
                    finished = True
                    raise chunk_error(chunk)
                self.metrics.on_token(call.rid, start)
                answer.add(chunk)
                finished = chunk.finish_reason is not None
            return answer
        finally:
            self.metrics.on_finish(call.rid, answer.finish_reason if finished else "abort", answer.prompt_tokens,
                                   answer.completion_tokens, answer.cached_tokens, start)
            await self.client.release(call.rid, finished)

    async def run(self, parsed: ParsedRequest, request: Request) -> list[Answer]:
        """Every answer of ``parsed``, in choice order. If one fails, the others are aborted (their
        KV freed) and the request gets that one's error."""
        tasks = [asyncio.ensure_future(self.run_one(call, request)) for call in parsed.calls()]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()  # no-op for the finished ones
            await asyncio.gather(*tasks, return_exceptions=True)  # let each release its request

    async def open_stream(self, parsed: ParsedRequest, request: Request, render: Render,
                          final: Callable[[list[Answer]], dict[str, Any] | None]) -> Response:
        """Submit a streamed request's engine requests and wait for the first chunk of each before
        answering. A request refused before its first token (too long for the context, a token id
        outside the vocabulary) then gets its 4xx as the HTTP status, as it would without
        streaming, rather than a 200 whose only event is an error."""
        calls = parsed.calls()
        queues = [await self.client.submit(call) for call in calls]
        start = time.perf_counter()
        firsts: list[TextChunk] = []

        async def give_up() -> None:
            """Release every answer; abort those still running (all but the ended ones)."""
            for i, call in enumerate(calls):
                ended = i < len(firsts) and firsts[i].finish_reason is not None
                self.metrics.on_finish(call.rid, None if ended else "abort", 0, 0, 0, start)
                await self.client.release(call.rid, ended)

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
        return StreamingResponse(self.stream(calls, queues, firsts, start, render, final, parsed.include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def stream(self, calls: list[EngineCall], queues: list[asyncio.Queue[TextChunk]], firsts: list[TextChunk],
                     start: float, render: Render, final: Callable[[list[Answer]], dict[str, Any] | None],
                     include_usage: bool) -> AsyncIterator[str]:
        """One event per chunk (``render(chunk, first, index)``), the usage event (``final``) if
        asked and there is one, ``[DONE]``.

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
                    self.metrics.on_token(calls[i].rid, start)
                    answers[i].add(chunk)
                    finished[i] = chunk.finish_reason is not None
                    events.append(render(chunk, not started[i], i))
                    started[i] = True
                yield "".join(events)
            if not failed and include_usage:
                last = final(answers)
                if last is not None:
                    yield sse(last)
            yield sse("[DONE]")
        finally:  # also when Starlette cancels us because the client went away
            for task in forwarders:
                task.cancel()
            for call, answer, done in zip(calls, answers, finished):
                self.metrics.on_finish(call.rid, answer.finish_reason if done else "abort", answer.prompt_tokens,
                                       answer.completion_tokens, answer.cached_tokens, start)
                await self.client.release(call.rid, done)

    async def tokenizer(self) -> Any:
        """The model's tokenizer, loaded once, off the event loop; a 404 if the server has none."""
        if self.tokenizer_source is None:
            raise APIError(404, "this server has no tokenizer endpoints", kind="not_found_error")
        if self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(load_tokenizer, self.tokenizer_source)
        return self._tokenizer

    # -- the endpoints --

    async def chat_completions(self, request: Request) -> Any:
        """OpenAI's chat completions: the messages through the model's chat template, one answer
        per choice (``n``), streamed as server-sent events if ``stream`` is true."""
        parsed = parse_chat(await read_json(request), self.model_name)
        return await self.respond(parsed, request, ChatShape(parsed, self.model_name))

    async def completions(self, request: Request) -> Any:
        """OpenAI's (legacy) completions: a prompt (text or token ids) or a batch of them
        continued, ``n`` answers each, streamed as server-sent events if ``stream`` is true."""
        parsed = parse_completion(await read_json(request), self.model_name)
        return await self.respond(parsed, request, CompletionShape(parsed, self.model_name))

    async def generate(self, request: Request) -> Any:
        """SGLang's native generation: ``text`` or ``input_ids`` with ``sampling_params``; the
        answer's text, its token ids and counts, streamed if ``stream`` is true."""
        parsed = parse_generate(await read_json(request))
        return await self.respond(parsed, request, GenerateShape())

    async def models(self) -> dict[str, Any]:
        """The one model served, as OpenAI lists models."""
        return {"object": "list", "data": [self.model_card]}

    async def model(self, model_id: str) -> dict[str, Any]:
        """The served model's card; a 404 naming the served model for any other id."""
        check_model({"model": model_id}, self.model_name)
        return self.model_card

    async def tokenize(self, request: Request) -> dict[str, Any]:
        """The token ids a completion (``prompt``) or chat (``messages``) request starts from."""
        prompt = parse_tokenize(await read_json(request), self.model_name)
        tok = await self.tokenizer()
        try:
            ids = encode_prompt(tok, prompt)
        except Exception as exc:  # a chat template refusing the conversation
            raise APIError(400, f"the prompt cannot be tokenized: {exc}"[:500], "messages") from None
        return {"tokens": ids, "count": len(ids), "max_model_len": self.max_model_len}

    async def detokenize(self, request: Request) -> dict[str, Any]:
        """The text of a list of token ids (each checked against the vocabulary)."""
        body = await read_json(request)
        tok = await self.tokenizer()
        ids = parse_detokenize(body, self.model_name, len(tok))
        return {"prompt": tok.decode(ids)}

    async def health(self) -> dict[str, Any]:
        """200 while the server serves (the only path that needs no API key)."""
        return {"status": "ok"}

    async def prometheus(self) -> Response:
        """The metrics in Prometheus' text format."""
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def flush_cache(self, request: Request) -> Response:
        """Empty the radix (prefix) cache, as SGLang's ``/flush_cache`` does (benchmark clients
        call it before a run): only while no request runs or waits. ``?timeout=S`` waits up to S
        seconds for the engine to become idle. 200 with a plain-text body when flushed; while
        requests run, a 400 with an OpenAI error body (SGLang answers 400 too, so a client written
        for it behaves the same here)."""
        timeout = flush_timeout(request.query_params.get("timeout"))
        deadline = time.monotonic() + timeout
        while True:
            result = await self.client.flush_cache()
            if result.ok or time.monotonic() >= deadline:
                break
            if await request.is_disconnected():
                return Response(status_code=499)
            await asyncio.sleep(min(FLUSH_RETRY_S, max(0.0, deadline - time.monotonic())))
        if not result.ok:
            raise APIError(400, result.message, code="engine_busy")
        self.metrics.cache_flushes.inc()
        return PlainTextResponse(f"Cache flushed.\n{result.message}\n")

    async def not_found(self, path: str) -> None:
        """Any other path: a 404 with OpenAI's error body."""
        raise APIError(404, f"no route /{path}", kind="not_found_error")


async def api_error(request: Request, exc: APIError) -> JSONResponse:
    """A refused request: its status and OpenAI's error body."""
    return error_response(exc)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (a 405 for OPTIONS /v1/completions) get OpenAI's error body too."""
    response = error_response(APIError(exc.status_code, str(exc.detail)))
    response.headers.update(exc.headers or {})
    return response


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug: logged, and a 500 with OpenAI's error body."""
    logger.exception("unhandled error in %s", request.url.path)
    return error_response(APIError(500, f"internal error: {type(exc).__name__}", kind="server_error"))


def serving(client: EngineClient, on_startup: Callable[[], None] | None) -> Callable[[FastAPI], Any]:
    """The app's lifespan: :meth:`EngineClient.pump` routes chunks while the app serves."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pump = asyncio.get_running_loop().create_task(client.pump())
        if on_startup is not None:
            on_startup()
        yield
        pump.cancel()

    return lifespan


def openapi_document(app: FastAPI, model_name: str, max_model_len: int | None) -> dict[str, Any]:
    """FastAPI's document, with the request models of ``protocol`` as its schemas (the handlers
    read the body themselves, for the 413/415 checks, so FastAPI cannot see them); built once."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        document.setdefault("components", {}).setdefault("schemas", {}).update(openapi_components(model_name, max_model_len))
        app.openapi_schema = document
    return app.openapi_schema


def responses(model: type[BaseModel] | None = None, streams: bool = False) -> dict[int | str, dict[str, Any]]:
    """An operation's documented responses: ``model`` as its 200 body (a JSON body; server-sent
    events instead when the request asks to ``stream``), OpenAI's error body as every 4xx's and 5xx's."""
    documented: dict[int | str, dict[str, Any]] = {"4XX": {"model": ErrorResponse, "description": "refused"},
                                                   "5XX": {"model": ErrorResponse, "description": "failed"}}
    if model is not None:
        documented[200] = {"model": model, "description": "the answer, as server-sent events (text/event-stream) "
                                                          "if the request asks to stream" if streams else "the answer"}
    return documented


def create_app(client: EngineClient, model_name: str, api_key: str | None = None,
               on_startup: Callable[[], None] | None = None, max_model_len: int | None = None,
               tokenizer_source: str | None = None) -> FastAPI:
    """The FastAPI app over ``client``: the routes of :class:`Endpoints`, OpenAI's error body for
    every error, the API key if one is given. ``model_name`` is what ``/v1/models`` lists and what
    requests may name; ``max_model_len`` (prompt + max_tokens of one request) is listed with it.
    ``tokenizer_source`` (the model's path or id) serves ``/tokenize`` and ``/detokenize``; its
    tokenizer is loaded on their first call."""
    app = FastAPI(title="minisgl", docs_url=None, redoc_url=None, lifespan=serving(client, on_startup))
    app.openapi = functools.partial(openapi_document, app, model_name, max_model_len)  # type: ignore[method-assign]
    app.add_exception_handler(APIError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, internal_error)
    if api_key is not None:
        app.add_middleware(APIKeyCheck, api_key=api_key)

    e = Endpoints(client, model_name, max_model_len, tokenizer_source)

    def route(path: str, endpoint: Callable[..., Any], *methods: str, **options: Any) -> None:
        # response_model=None: the handlers' return hints are for readers; FastAPI must not
        # validate, filter or document responses by them.
        app.add_api_route(path, endpoint, methods=list(methods), response_model=None, **options)

    for path, endpoint, model in (("/v1/chat/completions", e.chat_completions, ChatResponse),
                                  ("/v1/completions", e.completions, CompletionResponse),
                                  ("/generate", e.generate, GenerateResponse)):
        route(path, endpoint, "POST", openapi_extra=request_body(path), responses=responses(model, streams=True))
    route("/v1/models", e.models, "GET", responses=responses(ModelList))
    route("/v1/models/{model_id:path}", e.model, "GET", responses=responses(ModelCard))
    route("/tokenize", e.tokenize, "POST", openapi_extra=request_body("/tokenize"), responses=responses(TokenizeResponse))
    route("/detokenize", e.detokenize, "POST", openapi_extra=request_body("/detokenize"),
          responses=responses(DetokenizeResponse))
    route("/health", e.health, "GET")
    route("/metrics", e.prometheus, "GET")
    for method in ("POST", "GET"):
        route("/flush_cache", e.flush_cache, method, response_class=PlainTextResponse, openapi_extra=FLUSH_CACHE_DOC)
    route("/{path:path}", e.not_found, "GET", "POST", "PUT", "DELETE", "PATCH", include_in_schema=False)
    return app
