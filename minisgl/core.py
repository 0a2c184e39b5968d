"""Lesson 4: a request's life (`Req`) and one forward pass's worth of work (`Batch`).

Shared by the scheduler (which creates and updates them) and the engine (which runs a
`Batch`), so it lives below both.
"""

from __future__ import annotations

__lesson__ = 4

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from minisgl.attention.metadata import BatchMetadata
from minisgl.sampling_params import SamplingParams


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued (new, or retracted in lesson 5), owns no KV
    RUNNING = "running"  # admitted: owns a page-table row and pages
    FINISHED = "finished"  # left the batch (done, aborted or failed); its KV has been freed


class TokenLogprobs(NamedTuple):
    """The log-probabilities of one sampled token (``SamplingParams.logprobs``), from the raw
    logits: ``logprob`` is the chosen token's, ``top`` the ``k`` most likely ``(token id,
    logprob)`` pairs at that step, best first (empty for ``logprobs=0``).

    A tuple of plain values, so it crosses a process boundary as it is (JSON, msgpack); it
    arrives there as lists in the same order, ``[logprob, [[id, logprob], ...]]``."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass(eq=False)
class Req:
    """One generation request.

    ``num_cached`` counts the tokens whose K/V are in the pool, or will be once the batches
    already launched have run: it advances when a batch is launched. While the prompt is being
    prefilled, ``num_cached < len(prompt_ids)``; during decode ``num_cached == seq_len - 1``
    (the latest sampled token gets its KV written by the next step).

    Lesson 7 (overlap): a launched batch's sampled tokens reach the host one step later. Until
    then they are ``pending``: counted in ``seq_len`` (the sequence is that long on the device)
    but not yet in ``output_ids``. ``inflight`` counts the launched batches that contain the
    request and whose results are not processed yet; its KV may be freed only when that is 0.

    ``output_logprobs[i]`` belongs to ``output_ids[i]``; it is filled only for a request whose
    ``params.logprobs`` is set (for the others it stays empty).
    """

    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # why the request failed (finish_reason "error")
    num_cached: int = 0
    table_row: int = -1  # row in the page table while it owns KV, else -1
    generator: torch.Generator | None = None  # seeded sampling
    # Lesson 5 (radix cache): the first `num_tree_pages` pages of the row belong to the tree
    # (a locked match, ending at `cache_node`); the rest belong to this request alone.
    cache_node: Any = None
    num_tree_pages: int = 0
    num_cached_tokens: int | None = None  # prompt tokens served from the cache at first admission
    # Lesson 7: tokens sampled on the device but not read by the host yet; batches in flight.
    pending: int = 0
    inflight: int = 0
    release_deferred: bool | None = None  # finished while in flight: release (cache=this) later
    # Lesson 12 (speculative decoding): for each step that gave the request tokens (a prefill's
    # included), the draft tokens it verified (0: a plain step) and how many the target accepted.
    # The step added accepted + 1 tokens (fewer only where a stop token ended the request).
    spec_drafted: list[int] = field(default_factory=list)
    spec_accepted: list[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        """Tokens in the sequence, pending ones (lesson 7) included."""
        return len(self.prompt_ids) + len(self.output_ids) + self.pending

    @property
    def num_generated(self) -> int:
        """Tokens sampled so far, pending ones included."""
        return len(self.output_ids) + self.pending

    @property
    def decoding(self) -> bool:
        """Past its prefill: only the latest sampled token still needs its KV computed."""
        generated = len(self.output_ids) + self.pending  # (num_generated, inlined: asked every step)
        return generated > 0 and len(self.prompt_ids) + generated - self.num_cached == 1

    @property
    def wants_more(self) -> bool:
        """Whether another step can still give it a token (its ``max_tokens`` is not reached)."""
        return self.num_generated < self.params.max_tokens

    @property
    def all_ids(self) -> list[int]:
        """The prompt followed by every token generated so far."""
        return self.prompt_ids + self.output_ids

    @property
    def length_limit(self) -> int:
        """Longest this request can grow: its prompt plus ``max_tokens`` (KV is reserved for it).

        Not to be confused with ``EngineConfig.max_seq_len``, the cap for every request."""
        return len(self.prompt_ids) + self.params.max_tokens

    def uncached_ids(self) -> list[int]:
        """Tokens whose KV is not in the pool yet: the prompt's tail, or the latest output token.
        (Not for a request with a pending token: that token's id is only on the device.)"""
        assert self.pending == 0, "a pending token's id is on the device, not here"
        n = len(self.prompt_ids)
        if self.num_cached >= n:  # decoding: no copy of the whole sequence, every step
            return self.output_ids[self.num_cached - n:]
        return self.prompt_ids[self.num_cached:] + self.output_ids

    def append_token(self, token: int, logprobs: TokenLogprobs | None = None) -> None:
        """Record a sampled token (and its log-probabilities, if the request asked for them)
        and decide whether the request is done."""
        self.output_ids.append(token)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"


@dataclass
class Batch:
    """One forward pass: ``reqs`` with ``extend_lens[i]`` new tokens each, flattened.

    ``input_ids [T]`` and ``positions [T]`` hold the new tokens of every request back to back
    (T = sum(extend_lens)). ``samples[i]`` says whether row ``i`` chooses a token this step:
    false only for a non-final chunk of a prompt (lesson 6), which computes KV and nothing else.
    ``logits_indices [S]`` picks the last new token of each sampling row (S = sum(samples)).

    ``mode`` says what the batch holds: ``"prefill"`` (prompts or chunks only), ``"decode"``
    (one new token per request, every row sampling) or ``"mixed"`` (both, lesson 6); lesson 12
    adds ``"verify"``: some decode rows carry draft tokens after their last known token.

    Lesson 12: ``drafts[i]`` are the draft tokens appended to row ``i`` (empty for a row that does
    not speculate; ``drafts`` is None for a batch without any). A speculating row's new tokens are
    its last known token and then its drafts, and ``logits_indices`` picks *every* one of them:
    the target's verdict on each draft, plus one token more.

    Lesson 7: a decode row whose input token is still pending (sampled by the batch in flight)
    has a placeholder in ``input_ids``; ``device_token_at [G]`` lists those token indices and
    ``device_token_rows [G]`` the page-table rows whose latest sampled token (kept on the
    device by the engine) fills them. ``sample_rows [S]`` are the page-table rows of the
    sampling requests (the engine stores their new tokens there). ``cached_after[i]`` is row
    ``i``'s ``num_cached`` once the batch has run.

    ``logprobs`` is the engine's other result, set when the batch's tokens reach the host
    (:meth:`~minisgl.engine.engine.Engine.step`; lesson 7's ``StepFuture.result``): one entry per
    sampling row, ``None`` for a row whose request did not ask; ``None`` as a whole when no row
    asked. ``Scheduler.process`` hands each entry to its request with the token.
    """

    mode: str  # "prefill" | "decode" | "mixed"
    reqs: list[Req]
    extend_lens: list[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_indices: torch.Tensor
    meta: BatchMetadata
    samples: list[bool] | None = None  # None: every row samples
    device_token_at: torch.Tensor | None = None  # [G] int64
    device_token_rows: torch.Tensor | None = None  # [G] int64
    sample_rows: torch.Tensor | None = None  # [S] int64
    decode_rows: list[bool] | None = None  # row i was decoding when the batch was built
    cached_after: list[int] | None = None
    on_device: list[torch.Tensor] | None = None  # the engine's device copies of the index tensors
    booked: bool = False  # its rows' new tokens count as cached (the loop's ``book``; once per batch)
    logprobs: list[TokenLogprobs | None] | None = None  # per sampling row, once the results are read
    drafts: list[list[int]] | None = None  # lesson 12: per row, draft tokens after its last known token

    def __post_init__(self) -> None:
        if self.samples is None:
            self.samples = [True] * len(self.reqs)
        if self.decode_rows is None:
            self.decode_rows = [r.decoding for r in self.reqs]
        if self.cached_after is None:
            self.cached_after = [r.num_cached + n for r, n in zip(self.reqs, self.extend_lens)]
        empty = torch.zeros(0, dtype=torch.int64)
        if self.device_token_at is None:
            self.device_token_at, self.device_token_rows = empty, empty
        if self.sample_rows is None:
            self.sample_rows = torch.tensor([r.table_row for r in self.sampling_reqs], dtype=torch.int64)

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def sampling_reqs(self) -> list[Req]:
        """The requests that get a token from this step, in row order."""
        return [r for r, s in zip(self.reqs, self.samples) if s]
