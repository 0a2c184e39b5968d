"""Lesson 4: the engine runs one batch on the device: inputs in, plan attention, forward, sample.

Two seams let later lessons change *how* a step runs without touching this file:

* ``runner``, the forward pass itself. Here :class:`EagerRunner`: plan the attention backend
  for the batch, run the model. Lesson 8's graph runner replays captured decode steps and falls
  back to an eager runner for everything else.
* :meth:`Engine.inputs_on_device`, how a batch's index tensors reach the device. Here a plain
  copy. Lesson 7's engine (:mod:`minisgl.engine.overlap`) copies through pinned staging and
  takes pending input tokens from a device buffer instead.
"""

from __future__ import annotations

__lesson__ = 4

from typing import Protocol

import torch

from minisgl.attention.paged import PagedBackend
from minisgl.core import Batch
from minisgl.engine.sampler import Logprobs, Sampler
from minisgl.models.model import CausalLM


class ForwardRunner(Protocol):
    """Runs the model on one batch whose inputs are on the device."""

    backend: PagedBackend

    def forward(self, batch: Batch, input_ids: torch.Tensor, positions: torch.Tensor,
                logits_indices: torch.Tensor) -> torch.Tensor:
        """``[S, vocab]`` logits (the model's dtype) of the rows picked by ``logits_indices [S]``."""
        ...


class EagerRunner:
    """The forward pass as plain PyTorch calls: plan the backend for this batch, run the model."""

    def __init__(self, model: CausalLM, backend: PagedBackend) -> None:
        self.model = model
        self.backend = backend

    def forward(self, batch: Batch, input_ids: torch.Tensor, positions: torch.Tensor,
                logits_indices: torch.Tensor) -> torch.Tensor:
        attention = self.backend.plan(batch.meta)  # this batch's own plan
        logits = self.model(input_ids, positions, attention, logits_indices=logits_indices)
        attention.batch_enqueued()
        return logits


class Engine:
    """Owns the model, the attention backend (and through it the KV pool) and the sampler."""

    def __init__(self, model: CausalLM, backend: PagedBackend, sampler: Sampler | None = None,
                 runner: ForwardRunner | None = None) -> None:
        self.model = model
        self.backend = backend
        self.sampler = sampler or Sampler()
        self.runner: ForwardRunner = runner or EagerRunner(model, backend)
        self.device = next(model.parameters()).device

    def inputs_on_device(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``input_ids [T]``, ``positions [T]`` and ``logits_indices [S]`` on the device; all of
        the batch's device copies stay with it (``batch.on_device``) for the sampling after."""
        batch.on_device = [t.to(self.device) for t in (batch.input_ids, batch.positions, batch.logits_indices)]
        return batch.on_device[0], batch.on_device[1], batch.on_device[2]

    def forward(self, batch: Batch) -> torch.Tensor:
        """``[S, vocab]`` logits (the model's dtype) of the last new token of each sampling row."""
        return self.runner.forward(batch, *self.inputs_on_device(batch))

    def sample(self, batch: Batch) -> tuple[torch.Tensor, Logprobs | None]:
        """Run the batch and sample: ``[S]`` int64 tokens on the device, one per sampling row,
        and the log-probabilities of the rows whose request asked (None if none did; on the
        device too)."""
        logits = self.forward(batch)
        reqs = batch.sampling_reqs
        tokens = self.sampler.sample(logits, reqs)
        return tokens, self.sampler.logprobs(logits, reqs, tokens)

    def step(self, batch: Batch) -> list[int]:
        """Run the batch and return one sampled token per sampling row (``batch.sampling_reqs``);
        their log-probabilities, where asked, go to ``batch.logprobs``."""
        tokens, logprobs = self.sample(batch)
        batch.logprobs = None if logprobs is None else logprobs.per_row(tokens.numel())
        return tokens.tolist()
