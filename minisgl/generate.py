"""The single-request generate loop (lessons 1-3): prefill once, then one token per step.

The loop knows nothing about *where* K and V are stored. It talks to a :class:`SequenceKV`,
which before each forward makes room for the new tokens and returns an attention backend set
up for them. Lesson 1 passes a contiguous slab, lesson 2 a paged pool, lesson 3 the block
tensor: the loop stays the same.

Invariant: after the prefill of a ``T``-token prompt the cache holds KV for exactly ``T``
positions. The token sampled from the last logits has no KV yet; its K and V are written by the
*next* step, which feeds it as input at position ``T`` (then ``T + 1``, ...).
"""

from __future__ import annotations

__lesson__ = 1

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from minisgl.attention.base import AttentionBackend, NoCacheBackend
from minisgl.models.model import CausalLM


class SequenceKV(Protocol):
    """KV storage for one sequence, as seen by the generate loop."""

    def prepare(self, num_cached: int, num_new: int) -> AttentionBackend:
        """Make room for ``num_new`` tokens after ``num_cached`` cached ones; return the backend to run with."""
        ...

    def release(self) -> None:
        """The sequence is finished: give its KV back."""
        ...


@dataclass
class SequenceGenerator:
    """Greedy generation for one request, one :meth:`step` (one forward pass) at a time.

    Several generators may run interleaved over one shared KV pool (lesson 2): each step is
    independent of the others, because each request's KV lives in its own slots.
    """

    model: CausalLM
    kv: SequenceKV
    prompt_ids: Sequence[int]
    max_new_tokens: int
    stop_token_ids: Sequence[int] = ()
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (stop token), "length" (max_new_tokens), "abort" (error)
    last_logits: torch.Tensor | None = None  # [vocab] logits that chose the latest token

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("prompt must contain at least one token")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        self.device = next(self.model.parameters()).device

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_cached(self) -> int:
        """Tokens whose KV is in the cache: the prompt plus every output token but the latest."""
        return 0 if not self.output_ids else len(self.prompt_ids) + len(self.output_ids) - 1

    def step(self) -> int:
        """Run one forward pass (the prefill on the first call, a decode step after) and return the new token."""
        if self.finished:
            raise RuntimeError("generation already finished")
        if not self.output_ids:
            new_ids = list(self.prompt_ids)  # prefill: the whole prompt at once
        else:
            new_ids = [self.output_ids[-1]]  # decode: only the latest token
        start = self.num_cached
        input_ids = torch.tensor(new_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(new_ids), dtype=torch.long, device=self.device)
        last = torch.tensor([len(new_ids) - 1], device=self.device)
        try:
            backend = self.kv.prepare(start, len(new_ids))
            self.last_logits = self.model(input_ids, positions, backend, logits_indices=last)[0]
        except Exception:
            # e.g. the pool ran out of blocks: give back what this sequence holds, then report
            self.finish_reason = "abort"
            self.kv.release()
            raise
        token = int(self.last_logits.argmax())
        self.output_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        elif len(self.output_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.finished:
            self.kv.release()
        return token


def generate(
    model: CausalLM, kv: SequenceKV, prompt_ids: Sequence[int], max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
) -> list[int]:
    """Greedy new tokens for one prompt (the stop token, if hit, is included)."""
    gen = SequenceGenerator(model, kv, prompt_ids, max_new_tokens, stop_token_ids)
    while not gen.finished:
        gen.step()
    return gen.output_ids


def generate_without_cache(
    model: CausalLM, prompt_ids: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int] = ()
) -> list[int]:
    """The same greedy loop without a KV cache: every step recomputes the whole sequence (O(n^2))."""
    device = next(model.parameters()).device
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(max_new_tokens):
        t = torch.tensor(ids, device=device)
        last = torch.tensor([len(ids) - 1], device=device)
        logits = model(t, torch.arange(len(ids), device=device), NoCacheBackend(), logits_indices=last)
        token = int(logits[0].argmax())
        out.append(token)
        ids.append(token)
        if token in stop_token_ids:
            break
    return out
