"""Lesson 10: what the scheduler reports of each request after a step, in plain values.

A :class:`RequestEvent` crosses process boundaries (a tensor-parallel rank's JSON, the server's
msgpack from the scheduler to the tokenizer worker). It lives apart from
:mod:`minisgl.scheduler.streaming`, which makes the events, so that the tokenizer worker, which
only reads them, never imports the engine or torch: that costs each server start seconds.
"""

from __future__ import annotations

__lesson__ = 10

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minisgl.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minisgl.core import TokenLogprobs

SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


@dataclass
class RequestEvent:
    """New tokens of one request, and its end. ``finish_reason``: None while it runs, else
    ``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` (then ``error`` says why and ``status``
    is 400 for a request refused before it ran, 500 for one that failed while running).
    ``logprobs[i]`` belongs to ``token_ids[i]`` (a :class:`~minisgl.core.TokenLogprobs`, plain
    lists once it has crossed a process boundary); None unless the request asked for them."""

    rid: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    status: int = 200
    logprobs: list[TokenLogprobs] | None = None
