"""Lesson 7: overlap scheduling. Launch step N+1, *then* process step N's results.

Lesson 4's :class:`~minisgl.scheduler.scheduler.SyncLoop` leaves the device idle while the host
processes a batch's tokens and plans the next one. :class:`OverlapLoop` changes the loop, not
the decisions: a step launches batch N+1 on the device and only then processes batch N's
results, so the host's work (scheduling, building inputs, stop checks) hides behind the
device's. It needs an :class:`~minisgl.engine.overlap.OverlapEngine`, whose ``launch`` returns
before the device is done.

Batch N's tokens are *pending* while N+1 is planned: a launched batch is *booked* at once (its
rows' KV counts as cached, its sampled tokens as pending), a decode row takes its input token
from the engine's device buffer, and a request that turns out to have finished at N may already
sit in N+1; its extra token is dropped and its KV freed exactly once, after N+1 has been
processed (``Req.inflight`` counts the batches still holding it).
"""

from __future__ import annotations

__lesson__ = 7

import logging
from collections import deque

import torch

from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine.overlap import OverlapEngine, StepFuture
from minisgl.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class OverlapLoop:
    """The loop seam of :class:`~minisgl.scheduler.scheduler.Scheduler`, filled with the lagged
    loop. ``in_flight`` holds the launched batches not processed yet (at most two)."""

    def __init__(self, engine: OverlapEngine, max_rows: int) -> None:
        if not isinstance(engine, OverlapEngine):
            raise TypeError(f"overlap scheduling needs an OverlapEngine, got {type(engine).__name__}")
        engine.ensure_rows(max_rows)  # the device token buffer: one slot per page-table row
        self.in_flight: deque[tuple[Batch, StepFuture]] = deque()

    @property
    def busy(self) -> bool:
        return bool(self.in_flight)

    def step(self, sched: Scheduler, batch: Batch | None) -> list[Req]:
        """Launch ``batch`` (just scheduled; ``None``: nothing could be), *then* process the
        batch launched by the previous call, whose tokens the device has produced meanwhile."""
        finished: list[Req] = []
        had_previous = bool(self.in_flight)
        launched = batch is not None and self._launch(sched, batch, finished)
        keep = 1 if launched else 0  # everything but the batch just launched
        while len(self.in_flight) > keep:
            finished += self._complete(sched, *self.in_flight.popleft())
        if batch is None and not had_previous and sched.has_work:
            raise sched.stalled_error()
        return finished

    def flush(self, sched: Scheduler) -> list[Req]:
        """Process every batch still in flight; returns the requests they finished."""
        finished: list[Req] = []
        while self.in_flight:
            finished += self._complete(sched, *self.in_flight.popleft())
        return finished

    # --- the scheduler's calls ------------------------------------------------------------------
    def can_admit(self, req: Req) -> bool:
        return not req.pending  # retracted with a token in flight: wait until the host has it

    def prefills_in_flight(self) -> list[Req]:
        """The prefill rows of the batches in flight: their prompts are computed on the device
        but reach the radix cache only when processed, after the next batch is planned. A request
        sharing such a prefix waits for it (:meth:`Scheduler.admit`) instead of computing it again."""
        return [req for batch, _ in self.in_flight for req, decode in zip(batch.reqs, batch.decode_rows) if not decode]

    def input_ids(self, req: Req) -> list[int]:
        return [0] if req.pending else req.uncached_ids()  # a placeholder, replaced on the device

    def batch_built(self, batch: Batch) -> None:
        """List the rows whose input token is still on the device (sampled by the batch in
        flight): their token index and their page-table row."""
        token_at: list[int] = []
        token_rows: list[int] = []
        start = 0
        for req, n in zip(batch.reqs, batch.extend_lens):
            if req.pending:
                token_at.append(start)
                token_rows.append(req.table_row)
            start += n
        batch.device_token_at = torch.tensor(token_at, dtype=torch.int64)
        batch.device_token_rows = torch.tensor(token_rows, dtype=torch.int64)

    def book(self, batch: Batch) -> None:
        """Book a batch as launched (if it was run by hand, now): its rows' KV counts as cached
        and its sampled tokens as pending, so that the next batch can be planned before its
        results arrive."""
        if batch.booked:
            return
        batch.booked = True
        for req, n, samples in zip(batch.reqs, batch.extend_lens, batch.samples):
            req.num_cached += n
            req.pending += samples
            req.inflight += 1

    def row_done(self, sched: Scheduler, req: Req, samples: bool) -> None:
        """``req``'s row of a launched batch is done (processed or failed): one batch fewer in
        flight, its token no longer pending; a release deferred by :meth:`release` happens now
        if this was the last batch that held the request."""
        req.pending -= samples
        req.inflight -= 1
        if req.status == ReqStatus.FINISHED and req.inflight == 0 and req.release_deferred is not None:
            sched.kv.release_request(req, cache=req.release_deferred)
            req.release_deferred = None

    def release(self, sched: Scheduler, req: Req, cache: bool) -> None:
        """Free ``req``'s KV now, or, if a launched batch still uses it, when that batch has
        been processed."""
        if req.inflight > 0:
            req.release_deferred = cache
        else:
            sched.kv.release_request(req, cache=cache)

    # --- internals -------------------------------------------------------------------------------
    def _launch(self, sched: Scheduler, batch: Batch, finished: list[Req]) -> bool:
        """Launch ``batch`` and queue it in ``in_flight``; if launching raises, its requests fail
        (added to ``finished``) and this returns False."""
        self.book(batch)
        try:
            future = sched.engine.launch(batch)
        except Exception as exc:  # a kernel error, a sampler failure, ...: these requests fail alone
            logger.exception("batch of %d request(s) failed; finishing them with an error", batch.size)
            self._unlaunch(sched, batch)
            finished += sched.fail(batch.reqs, exc)
            return False
        except BaseException:  # Ctrl-C: nothing was launched; the caller cleans up its requests
            self._unlaunch(sched, batch)
            raise
        self.in_flight.append((batch, future))
        return True

    def _complete(self, sched: Scheduler, batch: Batch, future: StepFuture) -> list[Req]:
        try:
            tokens = future.result()
        except Exception as exc:
            logger.exception("batch of %d request(s) failed; finishing them with an error", batch.size)
            self._unlaunch(sched, batch)
            return sched.fail(batch.reqs, exc)
        except BaseException:  # Ctrl-C while waiting: the batch's results are dropped
            self._unlaunch(sched, batch)
            raise
        return sched.process(batch, tokens)

    def _unlaunch(self, sched: Scheduler, batch: Batch) -> None:
        """A launched batch failed: it will produce nothing. Its rows are no longer in flight
        (their requests are about to fail; a deferred release happens here if it was the last)."""
        for req, samples in zip(batch.reqs, batch.samples):
            self.row_done(sched, req, samples)
