"""Lesson 4: iteration-level (continuous) batching.

Every step the scheduler decides anew what runs: if waiting requests can be admitted (their
KV reserved), it runs a *prefill* batch of their prompts, flattened into one token stream;
otherwise a *decode* batch of every running request, one token each. Requests that finish
leave at once and free their KV, so a waiting request can take their place on the next step.

The scheduler is put together from three parts, each a seam a later lesson fills differently:

* ``kv``, who owns the KV pages: lesson 4's :class:`~minisgl.scheduler.kv_manager.KVManager`
  reserves a request's whole life at admission (lesson 5 puts a radix cache here);
* ``batching``, what goes into a step: lesson 4's :class:`WholePrompts` (lesson 6 fills a token
  budget with chunks of prompts and decode tokens together);
* ``loop``, how steps are driven: lesson 4's :class:`SyncLoop` runs a batch and processes its
  tokens before the next one is planned (lesson 7 launches the next batch first).

:func:`minisgl.engine.builder.make_scheduler` picks the parts from an
:class:`~minisgl.engine.config.EngineConfig`. Faults stay with the requests they concern: a
batch whose forward pass or sampling raises is finished with ``finish_reason == "error"`` and
its KV freed; the scheduler keeps serving. The KV geometry (page size, number of pages) comes
from the pool the engine serves, so the scheduler and the pool can never disagree about it.
"""

from __future__ import annotations

__lesson__ = 4

import itertools
import logging
from collections import deque
from collections.abc import Iterable
from typing import Protocol

import torch

from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.kv_manager import KVManager
from minisgl.utils import is_int

logger = logging.getLogger(__name__)


class RequestTooLongError(ValueError):
    """prompt + max_tokens can never fit (model context or the whole KV pool): rejected at once."""


class Batching(Protocol):
    """What goes into a step (the seam lesson 6 fills with a token budget)."""

    def next_batch(self, sched: Scheduler) -> Batch | None: ...


class Loop(Protocol):
    """How steps are driven (the seam lesson 7 fills with the lagged loop). The scheduler calls
    :meth:`step` once per iteration and the other methods while it builds and processes
    batches; a loop never edits the scheduler's queues itself (it asks :meth:`Scheduler.process`,
    :meth:`Scheduler.fail` and the KV manager)."""

    busy: bool  # batches launched whose results are not processed yet

    def step(self, sched: Scheduler, batch: Batch | None) -> list[Req]:
        """Run ``batch``, the one :meth:`Scheduler.schedule` just picked (``None``: nothing could
        be scheduled), and process results; returns the requests that finished."""
        ...

    def flush(self, sched: Scheduler) -> list[Req]:
        """Process every batch launched and not processed yet; returns the requests that finished."""
        ...

    def can_admit(self, req: Req) -> bool:
        """Whether ``req``, at the head of the queue, may be admitted now."""
        ...

    def prefills_in_flight(self) -> list[Req]:
        """The requests whose prompt KV a launched, unprocessed batch is computing (lesson 7):
        their prefixes reach the radix cache only when that batch is processed."""
        ...

    def input_ids(self, req: Req) -> list[int]:
        """The token ids ``req`` feeds into the next batch (its uncached tokens)."""
        ...

    def batch_built(self, batch: Batch) -> None:
        """``batch`` has just been built from the requests' ``input_ids`` (lesson 7 notes the rows
        whose input token is still on the device; lesson 12 lengthens decode rows by draft tokens)."""
        ...

    def book(self, batch: Batch) -> None:
        """``batch`` has run (or was launched): its rows' new tokens count as cached."""
        ...

    def row_done(self, sched: Scheduler, req: Req, samples: bool) -> None:
        """``req``'s row of a booked batch is being processed (or failed)."""
        ...

    def release(self, sched: Scheduler, req: Req, cache: bool) -> None:
        """Free a finished ``req``'s KV exactly once (``cache``: keep its valid prefix, lesson 5)."""
        ...


class Scheduler:
    """Queues, admission, batch building and the bookkeeping of results.

    ``config`` is read for ``max_running`` and ``max_seq_len`` (resolved: an int); the page
    size and count come from ``kv``, which was sized from the engine's pool."""

    def __init__(self, engine: Engine, config: EngineConfig, kv: KVManager, batching: Batching, loop: Loop,
                 eos_token_ids: Iterable[int] = (), vocab_size: int | None = None) -> None:
        if config.max_seq_len is None:
            raise ValueError("the scheduler needs a resolved config (max_seq_len set): see EngineConfig.resolve")
        self.engine = engine
        self.config = config
        self.kv = kv
        self.batching = batching
        self.loop = loop
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._ids = itertools.count()

    # --- requests in and out ----------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.kv.num_pages

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Req:
        """Queue a request, or raise a clear error if it can never run. Checks everything
        before anything changes: a rejected request leaves no trace."""
        params.validate()
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if not all(is_int(t) for t in prompt_ids):
            raise ValueError("prompt token ids must be integers (bools are not token ids)")
        vocab = self.vocab_size
        if vocab is not None and not all(0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab})")
        if vocab is not None and not all(t < vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids has ids outside the vocabulary [0, {vocab})")
        total = len(prompt_ids) + params.max_tokens
        if total > self.config.max_seq_len:
            raise RequestTooLongError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds the maximum sequence length {self.config.max_seq_len}"
            )
        if self.kv.pages_needed(total) > self.num_pages:
            raise RequestTooLongError(
                f"prompt + max_tokens = {total} tokens needs more KV than the whole pool holds "
                f"({self.num_pages * self.kv.page_size} tokens)"
            )
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        req = Req(next(self._ids), [int(t) for t in prompt_ids], params, frozenset(stop))
        if params.seed is not None and not params.greedy:
            req.generator = torch.Generator(device=self.engine.device).manual_seed(params.seed)
        self.waiting.append(req)
        return req

    def abort(self, req: Req) -> None:
        """Drop a request wherever it is; its KV (if any) is freed. Idempotent."""
        self._finish(req, req.finish_reason or "abort")

    def finish(self, req: Req, reason: str) -> None:
        """End an unfinished request now for ``reason`` (e.g. ``"stop"``: one of its stop strings,
        which only the text shows, appeared) and free its KV; a finished one is left alone."""
        if req.status != ReqStatus.FINISHED:
            self._finish(req, reason)

    def _finish(self, req: Req, reason: str) -> None:
        """Take ``req`` out of the queues and free its row and pages exactly once (when, is the
        loop's call: at once here, after the batches still holding it in lesson 7)."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        req.finish_reason = reason
        req.status = ReqStatus.FINISHED
        self.loop.release(self, req, cache=reason != "error")  # the KV of a failed step is not kept

    def fail(self, reqs: Iterable[Req], exc: BaseException) -> list[Req]:
        """Finish ``reqs`` with ``finish_reason="error"`` (the message in ``req.error``) and
        free their KV; returns those that were still unfinished."""
        failed = [r for r in reqs if r.status != ReqStatus.FINISHED]
        for req in failed:
            req.error = f"{type(exc).__name__}: {exc}"
            self._finish(req, "error")
        return failed

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loop.busy)

    # --- one iteration ------------------------------------------------------------------------
    def step(self) -> list[Req]:
        """One iteration (the loop's: schedule, run, process); returns the requests that
        finished in it.

        If the forward pass or the sampler raises, the batch's requests are the ones that
        fail: they are returned finished with ``finish_reason == "error"`` and their KV freed,
        and the next step runs as if they had never been there. (An interrupt such as Ctrl-C
        is not caught here: whoever drives the loop cleans up its own requests.)"""
        return self.loop.step(self, self.schedule())

    def flush(self) -> list[Req]:
        """Process every batch still launched and unprocessed (none in lesson 4's loop)."""
        return self.loop.flush(self)

    def schedule(self) -> Batch | None:
        """Pick the next batch (the batching policy's choice), or None if nothing can run."""
        return self.batching.next_batch(self)

    def make_room_for_decode(self) -> list[Req]:
        """The running requests that decode this step, each with room for its next token's KV
        (the KV manager's :meth:`~minisgl.scheduler.kv_manager.KVManager.make_room_for_decode`).
        Requests the manager retracted to make that room (lesson 5) go back to the front of the
        queue, waiting, the last retracted first."""
        decoding, retracted = self.kv.make_room_for_decode(self.running)
        for req in retracted:
            self.running.remove(req)
            req.status = ReqStatus.WAITING
            self.waiting.appendleft(req)
        return decoding

    def stalled_error(self) -> RuntimeError:
        """Work, but nothing can be scheduled: every request is checked to fit the empty pool at
        ``add_request``, so this means KV was lost."""
        return RuntimeError(
            f"scheduler stalled: {len(self.waiting)} waiting, {len(self.running)} running, "
            f"{self.kv.allocator.num_free}/{self.num_pages} pages free (KV leak?)"
        )

    def admit(self, req: Req, others: list[Req], budget: int | None = None) -> bool:
        """Try to admit the head of the queue: the loop must allow it, the KV manager must find
        its pages, and, when ``others`` are already admitted this step, its uncached tokens
        must fit ``budget``; and none of ``others``, nor a prefill still in flight (lesson 7's
        lagged loop), may be computing (a page or more of) its prefix (then a step or two later
        that prefix is cached and its prefill shrinks). On ``False`` nothing changed; on
        ``True`` it runs from this step on."""
        if not self.loop.can_admit(req) or not self.kv.admit_request(req, self.running):
            return False
        new_tokens = req.seq_len - req.num_cached
        computing = [*others, *self.loop.prefills_in_flight()]
        if (others and budget is not None and new_tokens > budget) or self.kv.shares_prefix(req, computing):
            self.kv.release_request(req, cache=False)  # give back what admit_request took
            req.num_cached = 0
            return False
        self.waiting.popleft()
        req.status = ReqStatus.RUNNING
        self.running.append(req)
        if req.num_cached_tokens is None:  # first admission (not a re-admission: lesson 5)
            req.num_cached_tokens = min(req.num_cached, len(req.prompt_ids))
            self.kv.stats.prompt_tokens += len(req.prompt_ids)
            self.kv.stats.hit_tokens += req.num_cached_tokens
        return True

    def build_batch(self, reqs: list[Req], num_new: list[int] | None = None) -> Batch:
        """Flatten the next tokens of ``reqs``: all their uncached tokens, or the first
        ``num_new[i]`` of them. A row samples only if it reaches the request's last known
        token; a row that stops short writes KV and nothing else."""
        ids: list[int] = []
        positions: list[int] = []
        extend_lens: list[int] = []
        samples: list[bool] = []
        decode_rows = [req.decoding for req in reqs]
        for i, req in enumerate(reqs):
            new = self.loop.input_ids(req)
            if num_new is not None:
                new = new[: num_new[i]]
            ids.extend(new)
            positions.extend(range(req.num_cached, req.num_cached + len(new)))
            extend_lens.append(len(new))
            samples.append(req.num_cached + len(new) == req.seq_len)
        meta = self.kv.page_table.metadata([r.table_row for r in reqs], [r.num_cached for r in reqs], extend_lens)
        ends = torch.tensor(extend_lens).cumsum(0) - 1
        logits_indices = ends[torch.tensor(samples)] if not all(samples) else ends
        mode = "decode" if all(decode_rows) else "mixed" if any(decode_rows) else "prefill"
        batch = Batch(mode, reqs, extend_lens, torch.tensor(ids), torch.tensor(positions), logits_indices, meta,
                      samples, decode_rows=decode_rows)
        self.loop.batch_built(batch)
        return batch

    def process(self, batch: Batch, tokens: list[int]) -> list[Req]:
        """Record a batch's sampled tokens (one per sampling row), with their log-probabilities
        where the engine left some (``batch.logprobs``); finished requests leave and free their
        KV. A batch run by hand (``tokens = engine.step(batch)``) works too."""
        self.loop.book(batch)
        finished = []
        sampled = iter(tokens)
        logprobs = iter(batch.logprobs) if batch.logprobs is not None else itertools.repeat(None)
        for req, samples, was_decode, valid in zip(batch.reqs, batch.samples, batch.decode_rows, batch.cached_after):
            tok, lp = (next(sampled), next(logprobs)) if samples else (None, None)
            self.loop.row_done(self, req, samples)
            if req.status == ReqStatus.FINISHED:  # aborted, failed or stopped while this batch ran
                continue  # an extra token after the end is dropped
            if tok is None:  # KV written, nothing sampled: its full pages can be shared already
                if req.status == ReqStatus.RUNNING:
                    self.kv.cache_prefix(req, valid)
                continue
            req.append_token(tok, lp)
            if req.finish_reason is not None:
                self._finish(req, req.finish_reason)
                finished.append(req)
            elif not was_decode and req.status == ReqStatus.RUNNING:
                self.kv.cache_prefix(req, valid)  # a prompt just computed: later arrivals may share it
        return finished


class WholePrompts:
    """Lesson 4's batching: admit-and-prefill if anything fits (whole prompts, first come first
    served, up to ``max_prefill_tokens`` uncached tokens per step, a longer prompt alone), else
    decode every running request."""

    def __init__(self, max_prefill_tokens: int) -> None:
        self.max_prefill_tokens = max_prefill_tokens

    def next_batch(self, sched: Scheduler) -> Batch | None:
        admitted: list[Req] = []
        budget = self.max_prefill_tokens
        while sched.waiting and len(sched.running) < sched.config.max_running:
            req = sched.waiting[0]
            if admitted and req.seq_len > budget:
                break  # cannot fit however much is cached (a long prompt may go alone)
            if not sched.admit(req, admitted, budget):
                break  # first-come first-served: nobody overtakes the head of the queue
            budget -= req.seq_len - req.num_cached
            admitted.append(req)
        if admitted:
            return sched.build_batch(admitted)
        decode = sched.make_room_for_decode()
        return sched.build_batch(decode) if decode else None


class SyncLoop:
    """Lesson 4's loop: schedule a batch, run it, process its tokens; then the next."""

    busy = False  # nothing is ever left running between two steps

    def step(self, sched: Scheduler, batch: Batch | None) -> list[Req]:
        if batch is None:
            if sched.has_work:
                raise sched.stalled_error()
            return []
        try:
            tokens = sched.engine.step(batch)
        except Exception as exc:  # a kernel error, a sampler failure, ...: these requests fail alone
            logger.exception("batch of %d request(s) failed; finishing them with an error", batch.size)
            return sched.fail(batch.reqs, exc)
        return sched.process(batch, tokens)

    def flush(self, sched: Scheduler) -> list[Req]:
        return []

    def can_admit(self, req: Req) -> bool:
        return True

    def prefills_in_flight(self) -> list[Req]:
        return []  # each batch is processed before the next is scheduled

    def input_ids(self, req: Req) -> list[int]:
        return req.uncached_ids()

    def batch_built(self, batch: Batch) -> None:
        pass

    def book(self, batch: Batch) -> None:
        """The batch has run: its rows' new tokens now have KV."""
        assert not batch.booked, "a batch is processed once"
        batch.booked = True
        for req, n in zip(batch.reqs, batch.extend_lens):
            req.num_cached += n

    def row_done(self, sched: Scheduler, req: Req, samples: bool) -> None:
        pass

    def release(self, sched: Scheduler, req: Req, cache: bool) -> None:
        sched.kv.release_request(req, cache=cache)  # exactly once (table_row becomes -1)
