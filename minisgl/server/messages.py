"""Lesson 10: every message that crosses a process boundary, and its wire format.

The server is three kinds of process (see :mod:`minisgl.server.launcher`):

    API server (HTTP)  ──GenerateRequest/AbortRequest──▶  tokenizer worker  ──AddRequest/AbortRequest──▶  scheduler
    API server         ◀──────────TextChunk / Stats──────  tokenizer worker  ◀────────TokenEvent / Stats──  scheduler

Each message is a dataclass, sent over ZMQ as msgpack: ``[type name, [field values...]]``.
Decoding looks the type name up in :data:`MESSAGE_TYPES` and builds the dataclass from plain
values (str, int, float, bool, None, lists, dicts), so a message can never make the receiver
run code. Pickle could: unpickling bytes from a socket executes whatever they describe, which is
why nothing here is ever pickled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

import msgpack


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


@dataclass
class TokenEvent:
    """Scheduler → tokenizer, once per step for every request that got tokens or finished.

    ``finish_reason``: None while running, else ``"stop"`` (EOS or a stop token id),
    ``"length"`` (max_tokens), ``"abort"`` or ``"error"`` (then ``error`` says why and
    ``status`` is the HTTP status: 400 for a request the engine refused, 500 for a failure)."""

    rid: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    status: int = 200


@dataclass
class TextChunk:
    """Tokenizer → API: the text of the new tokens of one request (one chunk per token).

    ``text`` may be empty: a token that ends inside a UTF-8 character, or text held back because
    it could still be the start of a stop string. ``finish_reason`` is set on the last chunk."""

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    status: int = 200


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


@dataclass
class Shutdown:
    """Launcher → children: finish and exit."""


@dataclass
class Ready:
    """Child → launcher (over a pipe, as bytes): started; ``info`` is what the others need to
    know (model name, context length, pool size), or ``error`` says why it could not start."""

    name: str
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


Message = Union[GenerateRequest, AddRequest, AbortRequest, TokenEvent, TextChunk, Stats, Shutdown, Ready]
MESSAGE_TYPES: dict[str, type] = {t.__name__: t for t in Message.__args__}  # type: ignore[attr-defined]


def encode(message: Message) -> bytes:
    """msgpack bytes of ``[type name, [field values in declaration order]]``."""
    name = type(message).__name__
    if name not in MESSAGE_TYPES:
        raise TypeError(f"{name} is not a message type")
    values = [getattr(message, f.name) for f in dataclasses.fields(message)]
    return msgpack.packb([name, values], use_bin_type=True)


def decode(data: bytes) -> Message:
    """The message that :func:`encode` made; ``ValueError`` for anything else."""
    try:
        name, values = msgpack.unpackb(data, raw=False, strict_map_key=True)
        cls = MESSAGE_TYPES[name]
        return cls(*values)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a minisgl message: {exc}") from None
