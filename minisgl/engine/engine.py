"""Lesson 4: the engine runs one batch on the device: plan attention, forward, sample."""

from __future__ import annotations

import torch

from minisgl.attention.paged import PagedBackend
from minisgl.engine.sampler import Sampler
from minisgl.models.model import CausalLM
from minisgl.core import Batch


class Engine:
    """Owns the model, the attention backend (and through it the KV pool) and the sampler."""

    def __init__(self, model: CausalLM, backend: PagedBackend, sampler: Sampler | None = None) -> None:
        self.model = model
        self.backend = backend
        self.sampler = sampler or Sampler()
        self.device = next(model.parameters()).device

    def forward(self, batch: Batch) -> torch.Tensor:
        """``[S, vocab]`` float32 logits of the last new token of each sampling row."""
        self.backend.plan(batch.meta)
        return self.model(
            batch.input_ids.to(self.device, non_blocking=True),
            batch.positions.to(self.device, non_blocking=True),
            self.backend,
            logits_indices=batch.logits_indices.to(self.device, non_blocking=True),
        )

    def step(self, batch: Batch) -> list[int]:
        """Run the batch and return one sampled token per sampling row (``batch.sampling_reqs``)."""
        return self.sampler(self.forward(batch), batch.sampling_reqs)
