"""Lesson 7: an engine whose steps can be launched ahead of their results.

:meth:`OverlapEngine.launch` enqueues everything (input copy, forward, sampling) and returns at
once with a :class:`StepFuture`; :meth:`StepFuture.result` waits for the sampled tokens.
Between the two the host may schedule and launch the next batch. Two things make that safe:

* sampled tokens stay on the device in a token buffer (``last_tokens``, one slot per page-table
  row), so the next batch can take a decode row's input token from there before the host has
  seen it (the batch lists those rows in ``device_token_at`` / ``device_token_rows``);
* a batch's index tensors reach the device through :class:`~minisgl.engine.staging.PinnedStaging`,
  whose buffers are never rewritten while a copy out of them may be pending.
"""

from __future__ import annotations

__lesson__ = 7

import dataclasses
from dataclasses import dataclass

import torch

from minisgl.core import Batch
from minisgl.engine.engine import Engine
from minisgl.engine.sampler import Logprobs
from minisgl.engine.staging import PinnedStaging


@dataclass
class StepFuture:
    """The sampled tokens of a launched batch, on their way to the host, and the
    log-probabilities its requests asked for (lesson 4's sampler: None if none did).

    ``host [S]`` is filled by an asynchronous copy, and so are ``logprobs``'s tensors (pinned
    host copies, made with the tokens'); ``done`` (CUDA) is recorded after all of them."""

    host: torch.Tensor
    done: torch.cuda.Event | None = None
    logprobs: Logprobs | None = None
    batch: Batch | None = None  # where result() leaves the logprobs (batch.logprobs)

    def result(self) -> list[int]:
        """Wait for the copies and return one token per sampling row; the log-probabilities,
        if any, go to ``batch.logprobs`` (as lesson 4's ``Engine.step`` leaves them)."""
        if self.done is not None:
            self.done.synchronize()
        if self.logprobs is not None and self.batch is not None:
            self.batch.logprobs = self.logprobs.per_row(self.host.numel())
        return self.host.tolist()


def to_pinned_host(t: torch.Tensor) -> torch.Tensor:
    """A copy of device tensor ``t`` into new pinned host memory, enqueued without waiting."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class OverlapEngine(Engine):
    """:class:`~minisgl.engine.engine.Engine` plus ``launch``, the device token buffer and
    pinned staging."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.staging = PinnedStaging(self.device)
        # The latest sampled token of each page-table row, on the device. [rows]
        # Sized by the scheduler's loop (ensure_rows), which knows the page table.
        self.last_tokens = torch.zeros(0, dtype=torch.int64, device=self.device)

    def ensure_rows(self, max_rows: int) -> None:
        """Make the device token buffer hold ``max_rows`` page-table rows."""
        if self.last_tokens.numel() < max_rows:
            self.last_tokens = torch.zeros(max_rows, dtype=torch.int64, device=self.device)

    def inputs_on_device(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One copy from pinned staging; then the pending input tokens are filled in from the
        device token buffer."""
        batch.on_device = self.staging.to_device([batch.input_ids, batch.positions, batch.logits_indices,
                                                  batch.device_token_at, batch.device_token_rows, batch.sample_rows])
        ids, positions, logits_indices, token_at, token_rows, _ = batch.on_device
        if token_at.numel():  # decode rows whose input token is still on the device
            ids[token_at] = self.last_tokens[token_rows]
        return ids, positions, logits_indices

    def launch(self, batch: Batch) -> StepFuture:
        """Enqueue the batch's forward pass and sampling; return without waiting for the device.
        The log-probabilities (where asked) stay on the device like the tokens and are copied
        to the host with them."""
        tokens, logprobs = self.sample(batch)  # [S] int64, on the device
        sample_rows = batch.on_device[5]
        if sample_rows.numel():
            self.last_tokens[sample_rows] = tokens
        if self.device.type != "cuda":
            return StepFuture(tokens, logprobs=logprobs, batch=batch)
        host = to_pinned_host(tokens)
        if logprobs is not None:
            logprobs = dataclasses.replace(logprobs, values=to_pinned_host(logprobs.values),
                                           ids=to_pinned_host(logprobs.ids))
        done = torch.cuda.Event()
        done.record()
        return StepFuture(host, done, logprobs, batch)

    def step(self, batch: Batch) -> list[int]:
        return self.launch(batch).result()
