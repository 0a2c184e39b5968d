"""Lesson 10: every message that crosses a process boundary, and its wire format.

The server is three kinds of process (see :mod:`minisgl.server.launcher`):

    API server (HTTP)  ──GenerateRequest/AbortRequest──▶  tokenizer worker  ──AddRequest/AbortRequest──▶  scheduler
    API server         ◀─────────────────ChunkBatch──────  tokenizer worker  ◀──────────────StepOutput──  scheduler

and, for ``/flush_cache``, :class:`FlushCache` the same way in and :class:`FlushResult` back.

One scheduler step makes one :class:`StepOutput` (a
:class:`~minisgl.scheduler.streaming.RequestEvent` per request that got tokens or finished, and
the engine's :class:`Stats`), and the tokenizer answers it with one
:class:`ChunkBatch` (a :class:`TextChunk` per token). A message per step, not per token: at
128 running requests a step makes 128 tokens, and every message has a fixed cost (encoding, a
system call, waking the receiver) that a batch pays once.

Each message is a dataclass, sent over ZMQ as msgpack: ``[type name, [field values...]]``.
Decoding looks the type name up in :data:`MESSAGE_TYPES` and builds the dataclass from plain
values (str, int, float, bool, None, lists, dicts), so a message can never make the receiver
run code. Pickle could: unpickling bytes from a socket executes whatever they describe, which is
why nothing here is ever pickled.
"""

from __future__ import annotations

__lesson__ = 10

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack
import zmq


@dataclass
class GenerateRequest:
    """API → tokenizer: one request, prompt not tokenized yet.

    ``prompt`` is text, or a list of token ids, or a list of ``{"role", "content"}`` messages
    for the chat template. ``params`` are :class:`SamplingParams` fields (``stop`` strings
    included); ``max_tokens=None`` means "up to the context length"."""

    rid: str
    prompt: Any
    params: dict[str, Any]


@dataclass
class AddRequest:
    """Tokenizer → scheduler: a tokenized request."""

    rid: str
    prompt_ids: list[int]
    params: dict[str, Any]


@dataclass
class AbortRequest:
    """API → tokenizer → scheduler: drop request ``rid`` and free its KV (client gone, or a stop
    string matched). Unknown or finished ids are ignored."""

    rid: str


class TextLogprobs(NamedTuple):
    """One token's log-probabilities as the API shows them: ``token`` is the token's name,
    ``logprob`` its log-probability, ``top`` the most likely tokens at that step as
    ``(name, logprob)``, best first, and ``text`` the text the token added to the answer (where
    the next token's text starts). A name tells its token apart from every other
    (:class:`~minisgl.server.tokenizer_worker.TokenNames`): mostly the token's text, but
    ``"<|im_end|>"`` for a special token, which adds no text, and ``"bytes:\\xe4"`` for a piece
    of a character. Plain lists, ``[token, logprob, [[name, logprob], ...], text]``, once it has
    crossed to the API."""

    token: str
    logprob: float
    top: list[tuple[str, float]]
    text: str


@dataclass
class TextChunk:
    """Tokenizer → API: the text of the new tokens of one request (one chunk per token).

    ``text`` may be empty: a token that ends inside a UTF-8 character, or text held back because
    it could still be the start of a stop string. ``finish_reason`` is set on the last chunk.
    ``logprobs`` (None unless the request asked) lists the tokens whose text this chunk
    completes: a token whose text is held back is listed in the chunk that shows it, and tokens
    whose text lies wholly inside a stop string (or after it) are never listed."""

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    status: int = 200
    logprobs: list[TextLogprobs] | None = None


@dataclass
class Stats:
    """Scheduler → (tokenizer) → API after each step: what ``/metrics`` reports about the engine."""

    running: int = 0
    waiting: int = 0
    num_pages: int = 0
    free_pages: int = 0
    cached_pages: int = 0  # held only by the radix cache (evictable)
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    # Lesson 12: verify rows so far by accepted draft tokens (index a: rows that accepted a);
    # empty without speculative decoding.
    spec_accepted: list[int] = field(default_factory=list)


@dataclass
class StepOutput:
    """Scheduler → tokenizer, once per step: ``events`` are
    :class:`~minisgl.scheduler.streaming.RequestEvent` field lists (see :func:`pack`), ``stats``
    a :class:`Stats` field list."""

    events: list[list[Any]]
    stats: list[Any]


@dataclass
class ChunkBatch:
    """Tokenizer → API, once per step (or once per refused request): ``chunks`` are
    :class:`TextChunk` field lists, ``stats`` a :class:`Stats` field list or None."""

    chunks: list[list[Any]]
    stats: list[Any] | None = None


@dataclass
class FlushCache:
    """API → tokenizer → scheduler: empty the radix cache (``/flush_cache``) if no request runs
    or waits. Answered by one :class:`FlushResult` with the same ``fid``."""

    fid: str


@dataclass
class FlushResult:
    """Scheduler → tokenizer → API: what :class:`FlushCache` ``fid`` did. ``ok`` False: refused
    (requests run; ``message`` says how many). ``stats``: a :class:`Stats` field list afterwards."""

    fid: str
    ok: bool
    message: str
    freed_pages: int = 0
    stats: list[Any] | None = None


@dataclass
class Shutdown:
    """Launcher → children: finish and exit."""


@dataclass
class Ready:
    """Child → launcher (on the launcher's ``ready`` socket): started; ``info`` is what the
    others need to know (context length, pool size, device), or ``error`` says why it could not
    start. The scheduler also sends its ``Ready`` to the tokenizer worker, as its first message
    there: the worker, started at the same time, waits for the context length."""

    name: str
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


Message = (GenerateRequest | AddRequest | AbortRequest | StepOutput | ChunkBatch | FlushCache | FlushResult
           | Shutdown | Ready)
MESSAGE_TYPES: dict[str, type] = {t.__name__: t for t in Message.__args__}  # type: ignore[attr-defined]


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names in declaration order (asked once per class: :func:`pack` runs
    once per generated token in the tokenizer worker)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def pack(item: Any) -> list[Any]:
    """A dataclass's field values in declaration order (how items travel inside a message)."""
    return [getattr(item, name) for name in field_names(type(item))]


def encode(message: Message) -> bytes:
    """msgpack bytes of ``[type name, [field values in declaration order]]``."""
    name = type(message).__name__
    if name not in MESSAGE_TYPES:
        raise TypeError(f"{name} is not a message type")
    return msgpack.packb([name, pack(message)], use_bin_type=True)


def decode(data: bytes) -> Message:
    """The message that :func:`encode` made; ``ValueError`` for anything else."""
    try:
        name, values = msgpack.unpackb(data, raw=False, strict_map_key=True)
        cls = MESSAGE_TYPES[name]
        return cls(*values)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a minisgl message: {exc}") from None


def send_ready(address: str, ready: Ready) -> None:
    """Tell the launcher (listening on ``address``) that this child started, or why it did not."""
    context = zmq.Context.instance()
    socket = context.socket(zmq.PUSH)
    socket.connect(address)
    socket.send(encode(ready))
    socket.close(linger=2000)
