"""Lesson 4: iteration-level (continuous) batching.

Every step the scheduler decides anew what runs: if waiting requests can be admitted (their
KV reserved), it runs a *prefill* batch of their prompts, flattened into one token stream;
otherwise a *decode* batch of every running request, one token each. Requests that finish
leave at once and free their KV, so a waiting request can take their place on the next step.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Iterable

import torch

from minisgl.engine.engine import Engine
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.page_table import KVManager
from minisgl.core import Batch, Req, ReqStatus


class RequestTooLongError(ValueError):
    """prompt + max_tokens can never fit (model context or the whole KV pool): rejected at once."""


@dataclass(frozen=True)
class SchedulerConfig:
    num_pages: int
    page_size: int = 16
    max_running: int = 256  # the largest decode batch
    max_prefill_tokens: int = 8192  # prompt tokens admitted per prefill step
    max_seq_len: int = 4096  # prompt + max_tokens of one request

    def __post_init__(self) -> None:
        for name in ("num_pages", "page_size", "max_running", "max_prefill_tokens", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")


class Scheduler:
    def __init__(self, engine: Engine, config: SchedulerConfig, eos_token_ids: Iterable[int] = (), vocab_size: int | None = None) -> None:
        self.engine = engine
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.kv = KVManager(config.num_pages, config.page_size, config.max_running, config.max_seq_len)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._ids = itertools.count()

    # --- requests in and out ----------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Req:
        """Queue a request, or raise a clear error if it can never run."""
        params.validate()
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if self.vocab_size is not None and not all(0 <= t < self.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt has token ids outside the vocabulary [0, {self.vocab_size})")
        total = len(prompt_ids) + params.max_tokens
        if total > self.config.max_seq_len:
            raise RequestTooLongError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds the maximum sequence length {self.config.max_seq_len}"
            )
        if self.kv.pages_needed(total) > self.config.num_pages:
            raise RequestTooLongError(
                f"prompt + max_tokens = {total} tokens needs more KV than the whole pool holds "
                f"({self.config.num_pages * self.config.page_size} tokens)"
            )
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        req = Req(next(self._ids), list(prompt_ids), params, frozenset(stop))
        if params.seed is not None and not params.greedy:
            req.generator = torch.Generator(device=self.engine.device).manual_seed(params.seed)
        self.waiting.append(req)
        return req

    def abort(self, req: Req) -> None:
        """Drop a request wherever it is; its KV (if any) is freed."""
        if req.status == ReqStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
        elif req.status == ReqStatus.RUNNING:
            self.running.remove(req)
            self.kv.release(req.table_row)
        req.finish_reason = req.finish_reason or "abort"
        req.status = ReqStatus.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one iteration ------------------------------------------------------------------------
    def schedule(self) -> Batch | None:
        """Pick the next batch: admit-and-prefill if anything fits, else decode everyone."""
        admitted: list[Req] = []
        budget = self.config.max_prefill_tokens
        while self.waiting and len(self.running) + len(admitted) < self.config.max_running:
            req = self.waiting[0]
            fits_budget = len(req.prompt_ids) <= budget or not admitted  # a long prompt may go alone
            if not fits_budget or not self.kv.can_admit(req.max_seq_len):
                break  # first-come first-served: nobody overtakes the head of the queue
            self.waiting.popleft()
            req.table_row = self.kv.admit(req.max_seq_len)
            req.status = ReqStatus.RUNNING
            budget -= len(req.prompt_ids)
            admitted.append(req)
        if admitted:
            self.running.extend(admitted)
            return self._build_batch("prefill", admitted)
        if self.running:
            return self._build_batch("decode", list(self.running))
        return None

    def _build_batch(self, mode: str, reqs: list[Req]) -> Batch:
        ids: list[int] = []
        positions: list[int] = []
        extend_lens: list[int] = []
        for req in reqs:
            new = req.uncached_ids()
            ids.extend(new)
            positions.extend(range(req.num_cached, req.num_cached + len(new)))
            extend_lens.append(len(new))
        meta = self.kv.page_table.metadata([r.table_row for r in reqs], [r.num_cached for r in reqs], extend_lens)
        ends = torch.tensor(extend_lens).cumsum(0) - 1
        return Batch(mode, reqs, extend_lens, torch.tensor(ids), torch.tensor(positions), ends, meta)

    def process(self, batch: Batch, tokens: list[int]) -> list[Req]:
        """Record the sampled tokens; finished requests leave and free their KV at once."""
        finished = []
        for req, n, tok in zip(batch.reqs, batch.extend_lens, tokens):
            if req.status != ReqStatus.RUNNING:
                continue  # aborted while the batch ran
            req.num_cached += n
            req.append_token(tok)
            if req.finish_reason is not None:
                self.running.remove(req)
                self.kv.release(req.table_row)
                req.status = ReqStatus.FINISHED
                finished.append(req)
        return finished

    def step(self) -> list[Req]:
        """Schedule, run and process one batch; returns the requests that finished in it."""
        batch = self.schedule()
        if batch is None:
            if self.has_work:  # add_request guarantees every request fits the empty pool
                raise RuntimeError(
                    f"scheduler stalled: {len(self.waiting)} waiting, {len(self.running)} running, "
                    f"{self.kv.allocator.num_free}/{self.config.num_pages} pages free (KV leak?)"
                )
            return []
        return self.process(batch, self.engine.step(batch))
