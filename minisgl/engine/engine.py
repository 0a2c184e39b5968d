"""Lessons 4 and 7: the engine runs one batch on the device: plan attention, forward, sample.

Lesson 7 splits a step in two so that the host can work while the device runs:
:meth:`Engine.launch` enqueues everything (input copy, forward, sampling) and returns at once
with a :class:`StepFuture`; :meth:`StepFuture.result` waits for the sampled tokens. Between
the two the host may schedule and launch the next batch. Sampled tokens stay on the device in
a token buffer (one slot per page-table row), so the next batch can take a decode row's input
token from there before the host has seen it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention.paged import PagedBackend
from minisgl.core import Batch
from minisgl.engine.graph import GraphRunner
from minisgl.engine.sampler import Sampler
from minisgl.engine.staging import PinnedStaging
from minisgl.models.model import CausalLM


@dataclass
class StepFuture:
    """The sampled tokens of a launched batch, on their way to the host.

    ``host [S]`` is filled by an asynchronous copy; ``done`` (CUDA) is recorded after it."""

    host: torch.Tensor
    done: torch.cuda.Event | None = None

    def result(self) -> list[int]:
        """Wait for the copy and return one token per sampling row."""
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


class Engine:
    """Owns the model, the attention backend (and through it the KV pool) and the sampler."""

    def __init__(self, model: CausalLM, backend: PagedBackend, sampler: Sampler | None = None,
                 graphs: GraphRunner | None = None) -> None:
        self.model = model
        self.backend = backend
        self.sampler = sampler or Sampler()
        self.graphs = graphs  # lesson 8: decode batches it can hold run through it
        self.device = next(model.parameters()).device
        self.staging = PinnedStaging(self.device)
        # Lesson 7: the latest sampled token of each page-table row, on the device. [rows]
        # Sized by the scheduler (ensure_rows), which owns the page table.
        self.last_tokens = torch.zeros(0, dtype=torch.int64, device=self.device)

    def ensure_rows(self, max_rows: int) -> None:
        """Make the device token buffer hold ``max_rows`` page-table rows."""
        if self.last_tokens.numel() < max_rows:
            self.last_tokens = torch.zeros(max_rows, dtype=torch.int64, device=self.device)

    def forward(self, batch: Batch) -> torch.Tensor:
        """``[S, vocab]`` float32 logits of the last new token of each sampling row.

        The batch's host index tensors reach the device in one copy from pinned staging; the
        device copies stay with the batch (``batch.on_device``) for the sampling that follows.
        A decode batch that the graph runner holds (lesson 8) runs through it; anything else
        runs eagerly."""
        batch.on_device = self.staging.to_device([batch.input_ids, batch.positions, batch.logits_indices,
                                                  batch.device_token_at, batch.device_token_rows, batch.sample_rows])
        ids, positions, logits_indices, token_at, token_rows, _ = batch.on_device
        if token_at.numel():  # decode rows whose input token is still on the device
            ids[token_at] = self.last_tokens[token_rows]
        if self.graphs is not None:
            if self.graphs.can_run(batch):
                return self.graphs.run(batch, ids, positions)
            self.graphs.stats.eager_decodes += batch.mode == "decode"
        attention = self.backend.plan(batch.meta)  # this batch's own plan (lesson 7)
        logits = self.model(ids, positions, attention, logits_indices=logits_indices)
        attention.batch_enqueued()
        return logits

    def launch(self, batch: Batch) -> StepFuture:
        """Enqueue the batch's forward pass and sampling; return without waiting for the device."""
        logits = self.forward(batch)
        tokens = self.sampler.sample(logits, batch.sampling_reqs)  # [S] int64, on the device
        sample_rows = batch.on_device[5]
        if sample_rows.numel():
            self.last_tokens[sample_rows] = tokens
        if self.device.type != "cuda":
            return StepFuture(tokens)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return StepFuture(host, done)

    def step(self, batch: Batch) -> list[int]:
        """Run the batch and return one sampled token per sampling row (``batch.sampling_reqs``)."""
        return self.launch(batch).result()
