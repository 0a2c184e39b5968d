"""Lessons 4-5: iteration-level (continuous) batching, with a prefix cache.

Every step the scheduler decides anew what runs: if waiting requests can be admitted (their
KV reserved), it runs a *prefill* batch of their prompts, flattened into one token stream;
otherwise a *decode* batch of every running request, one token each. Requests that finish
leave at once and free their KV, so a waiting request can take their place on the next step.

Lesson 5 puts a radix cache under it (``SchedulerConfig.prefix_cache``, on by default): a
request is admitted with pages for its uncached prompt only and takes decode pages one at a
time; when none can be found, the running requests with the least progress are *retracted*
(their KV goes into the tree, they go back to the front of the queue, and their re-admission
is a cache hit). With the cache off, lesson 4's policy holds: pages for the whole life are
reserved at admission and nothing is ever retracted.

Lesson 7 (``SchedulerConfig.overlap``) changes the loop, not the decisions: a step launches
batch N+1 on the device and only then processes batch N's results, so the host's work
(scheduling, building inputs, stop checks) hides behind the device's. Batch N's tokens are
*pending* while N+1 is planned: a decode row takes its input token from the engine's device
buffer, and a request that turns out to have finished at N may already sit in N+1; its extra
token is dropped and its KV freed exactly once, after N+1 has been processed.

Faults stay with the requests they concern: a batch whose forward pass or sampling raises is
finished with ``finish_reason == "error"`` and its KV freed; the scheduler keeps serving.
The KV geometry (page size, number of pages) comes from the pool the engine serves, so the
scheduler and the pool can never disagree about it.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Iterable

import torch

from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine.engine import Engine, StepFuture
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.cache_manager import CacheManager
from minisgl.scheduler.kv_manager import KVManager
from minisgl.utils import is_int, require_int

logger = logging.getLogger(__name__)


class RequestTooLongError(ValueError):
    """prompt + max_tokens can never fit (model context or the whole KV pool): rejected at once."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits. The KV geometry is not here: it belongs to the pool (one source of truth)."""

    max_running: int = 256  # the largest decode batch
    max_prefill_tokens: int = 8192  # prompt tokens admitted per prefill step
    max_seq_len: int = 4096  # cap on prompt + max_tokens of any request
    prefix_cache: bool = True  # lesson 5: share prefixes through a radix tree; False: lesson 4
    # Lesson 6: tokens per step, decode tokens and prompt chunks together. None: whole prompts,
    # and a step is either a prefill (up to max_prefill_tokens) or a decode.
    chunked_prefill_size: int | None = None
    # Lesson 7: launch step N+1 before processing step N's results. False: the synchronous loop.
    overlap: bool = False

    def __post_init__(self) -> None:
        for name in ("max_running", "max_prefill_tokens", "max_seq_len"):
            require_int("SchedulerConfig", name, getattr(self, name))
        if self.chunked_prefill_size is not None:
            require_int("SchedulerConfig", "chunked_prefill_size", self.chunked_prefill_size)
        for name in ("prefix_cache", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SchedulerConfig.{name} must be True or False, got {getattr(self, name)!r}")


class Scheduler:
    def __init__(self, engine: Engine, config: SchedulerConfig, eos_token_ids: Iterable[int] = (), vocab_size: int | None = None) -> None:
        self.engine = engine
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        pool = engine.backend.pool  # page size and page count are read from the pool, never declared twice
        manager = CacheManager if config.prefix_cache else KVManager
        self.kv: CacheManager | KVManager = manager(pool.num_pages, pool.page_size, config.max_running, config.max_seq_len)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._ids = itertools.count()
        engine.ensure_rows(config.max_running)  # the device token buffer: one slot per page-table row
        self.in_flight: deque[tuple[Batch, StepFuture]] = deque()  # lesson 7: launched, not processed yet

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

    def stop(self, req: Req) -> None:
        """Lesson 10: one of the request's stop strings appeared in its text (which only the
        detokenizer sees): finish it as ``"stop"`` now and free its KV."""
        if req.status != ReqStatus.FINISHED:
            self._finish(req, "stop")

    def _finish(self, req: Req, reason: str) -> None:
        """Take ``req`` out of the queues and free its row and pages exactly once: now, or, if a
        launched batch still uses them (lesson 7), when that batch has been processed."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        req.finish_reason = reason
        req.status = ReqStatus.FINISHED
        cache = reason != "error"  # the KV of a failed step is not kept
        if req.inflight > 0:
            req.release_deferred = cache
        else:
            self.kv.release_request(req, cache=cache)  # exactly once (table_row becomes -1)

    def retract(self, req: Req) -> None:
        """Lesson 5: stop a running request to free its pages. Its KV goes into the tree and it
        returns to the front of the queue; re-admission recomputes only what was not cached, and
        its outputs continue exactly as if it had never stopped."""
        self.running.remove(req)
        self.kv.release_request(req, cache=True)
        req.num_cached = 0
        req.status = ReqStatus.WAITING
        self.waiting.appendleft(req)
        self.kv.stats.retractions += 1

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
        return bool(self.waiting or self.running or self.in_flight)

    # --- one iteration ------------------------------------------------------------------------
    def schedule(self) -> Batch | None:
        """Pick the next batch: admit-and-prefill if anything fits, else decode everyone
        (lesson 6, with ``chunked_prefill_size``: both at once, see :meth:`_schedule_chunked`)."""
        if self.config.chunked_prefill_size is not None:
            return self._schedule_chunked(self.config.chunked_prefill_size)
        admitted: list[Req] = []
        budget = self.config.max_prefill_tokens
        while self.waiting and len(self.running) < self.config.max_running:
            req = self.waiting[0]
            if req.pending:
                break  # retracted with a token in flight (lesson 7): wait until the host has it
            if admitted and req.seq_len > budget:
                break  # cannot fit however much is cached (a long prompt may go alone)
            if not self.kv.admit_request(req, self.running):
                break  # first-come first-served: nobody overtakes the head of the queue
            new_tokens = req.seq_len - req.num_cached
            # Undo and stop if the cache hit was too small to fit the budget, or if a request of
            # this very batch is computing (a page or more of) req's prefix: one step later
            # that prefix is in the tree and req's prefill shrinks to its own part.
            if admitted and (new_tokens > budget or self._shares_prefix_with(req, admitted)):
                self._undo_admission(req)
                break
            self._start(req)
            budget -= new_tokens
            admitted.append(req)
        if admitted:
            return self._build_batch(admitted)
        decode = self._make_room_for_decode()
        return self._build_batch(decode) if decode else None

    def _schedule_chunked(self, budget: int) -> Batch | None:
        """Lesson 6: one batch of about ``budget`` tokens, filled in this order:

        1. one token for every decoding request (always, even past the budget);
        2. new requests, first come first served, each with its whole uncached prompt while it
           fits what is left; the first one that does not fit starts chunking if nobody else
           is mid-prefill, otherwise it waits;
        3. the next chunk of the request(s) still prefilling, with whatever is left.

        Short requests that arrive behind a long prompt therefore start at once instead of
        waiting for all its chunks, and at most one prompt at a time is being chunked."""
        if not self.running and not self.waiting:
            return None
        decoding = self._make_room_for_decode()
        prefilling = [r for r in self.running if not r.decoding]
        reqs, chunks = list(decoding), [1] * len(decoding)
        budget -= len(decoding)
        admitted: list[Req] = []
        while budget > 0 and self.waiting and len(self.running) < self.config.max_running:
            req = self.waiting[0]
            if req.pending or not self.kv.admit_request(req, self.running):
                break
            new_tokens = req.seq_len - req.num_cached
            if (new_tokens > budget and (prefilling or admitted)) or self._shares_prefix_with(req, prefilling + admitted):
                self._undo_admission(req)  # wait: no second chunked prompt, or a prefix is on its way
                break
            self._start(req)
            reqs.append(req)
            chunks.append(min(new_tokens, budget))
            budget -= chunks[-1]
            admitted.append(req)
        for req in prefilling:
            if budget <= 0:
                break
            reqs.append(req)
            chunks.append(min(req.seq_len - req.num_cached, budget))
            budget -= chunks[-1]
        return self._build_batch(reqs, chunks) if reqs else None

    def _start(self, req: Req) -> None:
        """Commit the admission of the head of the queue: it runs from this step on."""
        self.waiting.popleft()
        req.status = ReqStatus.RUNNING
        self.running.append(req)
        if req.num_cached_tokens is None:  # first admission (not a re-admission after retraction)
            req.num_cached_tokens = min(req.num_cached, len(req.prompt_ids))
            self.kv.stats.prompt_tokens += len(req.prompt_ids)
            self.kv.stats.hit_tokens += req.num_cached_tokens

    def _undo_admission(self, req: Req) -> None:
        """Give back what ``admit_request`` took; ``req`` stays at the head of the queue."""
        self.kv.release_request(req, cache=False)
        req.num_cached = 0

    def _shares_prefix_with(self, req: Req, admitted: list[Req]) -> bool:
        """Lesson 5: would waiting one step turn at least a page of ``req``'s prefill into a hit?"""
        if not self.config.prefix_cache:
            return False
        ps, tokens = self.kv.page_size, req.all_ids
        limit = len(tokens) - self.kv.MIN_UNCACHED
        for other in admitted:
            same = common_prefix_len(tokens, other.all_ids, limit)
            if same // ps * ps >= req.num_cached + ps:
                return True
        return False

    def _make_room_for_decode(self) -> list[Req]:
        """Every decoding request that still wants a token is about to write one token's KV (at
        position ``seq_len - 1``). Give each the page it may need, most progress first; when the
        pool is dry, retract the requests with the least progress (fewest generated tokens, then
        the newest) until the rest fit. One request alone always fits: admission checked it fits
        the empty pool. Returns the requests that decode this step, in running order.

        (Lesson 7: a request whose ``max_tokens`` is reached by a pending token is not decoded
        again; it leaves when that token is processed.)"""
        decodes = {r.rid for r in self.running if r.decoding and r.wants_more}  # once per step
        by_progress = sorted(self.running, key=lambda r: (-r.num_generated, r.rid))  # victims from the end
        i = 0
        while i < len(by_progress):
            req = by_progress[i]
            if req.rid not in decodes or self.kv.ensure_capacity(req, req.seq_len):
                i += 1
                continue
            if len(by_progress) == 1:
                raise RuntimeError(
                    f"no page for request {by_progress[0].rid} even alone: {self.kv.allocator.num_free} free, "
                    f"{self.kv.owned_pages()} owned of {self.num_pages} (KV accounting bug)"
                )
            self.retract(by_progress.pop())  # least progress (may be the request that asked)
        return [r for r in self.running if r.rid in decodes]

    def _build_batch(self, reqs: list[Req], chunks: list[int] | None = None) -> Batch:
        """Flatten the next tokens of ``reqs``: all their uncached tokens, or the first
        ``chunks[i]`` of them (lesson 6). A row samples only if it reaches the request's last
        known token; a non-final chunk writes KV and nothing else."""
        ids: list[int] = []
        positions: list[int] = []
        extend_lens: list[int] = []
        samples: list[bool] = []
        token_at: list[int] = []  # lesson 7: input tokens still on the device ...
        token_rows: list[int] = []  # ... in these page-table rows of the engine's token buffer
        decode_rows = [req.decoding for req in reqs]
        for i, req in enumerate(reqs):
            if req.pending:  # its latest token was sampled by the batch in flight
                token_at.append(len(ids))
                token_rows.append(req.table_row)
                new = [0]  # placeholder, replaced on the device
            else:
                new = req.uncached_ids()
            if chunks is not None:
                new = new[: chunks[i]]
            ids.extend(new)
            positions.extend(range(req.num_cached, req.num_cached + len(new)))
            extend_lens.append(len(new))
            samples.append(req.num_cached + len(new) == req.seq_len)
        meta = self.kv.page_table.metadata([r.table_row for r in reqs], [r.num_cached for r in reqs], extend_lens)
        ends = torch.tensor(extend_lens).cumsum(0) - 1
        logits_indices = ends[torch.tensor(samples)] if not all(samples) else ends
        mode = "decode" if all(decode_rows) else "mixed" if any(decode_rows) else "prefill"
        return Batch(mode, reqs, extend_lens, torch.tensor(ids), torch.tensor(positions), logits_indices, meta, samples,
                     decode_rows=decode_rows, device_token_at=torch.tensor(token_at, dtype=torch.int64),
                     device_token_rows=torch.tensor(token_rows, dtype=torch.int64))

    def launched(self, batch: Batch) -> None:
        """Book a batch as launched: its rows' KV counts as cached and its sampled tokens as
        pending from now on, so that the next batch can be planned before its results arrive."""
        assert not batch.booked, "a batch is launched once"
        batch.booked = True
        for req, n, samples in zip(batch.reqs, batch.extend_lens, batch.samples):
            req.num_cached += n
            req.pending += samples
            req.inflight += 1

    def process(self, batch: Batch, tokens: list[int]) -> list[Req]:
        """Record a launched batch's sampled tokens; finished requests leave and free their KV
        (or, if a later batch still holds them, as soon as that one is processed).

        A batch run by hand (``tokens = engine.step(batch)``, as lessons 4-6 do) is booked here."""
        if not batch.booked:
            self.launched(batch)
        finished = []
        sampled = iter(tokens)
        for req, samples, was_decode, valid in zip(batch.reqs, batch.samples, batch.decode_rows, batch.cached_after):
            tok = next(sampled) if samples else None  # a non-final chunk (lesson 6) has no token
            self._leave_batch(req, samples)
            if req.status == ReqStatus.FINISHED:  # aborted, failed or stopped while this batch ran
                continue  # an extra token after the end is dropped
            if tok is None:
                if req.status == ReqStatus.RUNNING:
                    self.kv.cache_prefix(req, valid)  # its full pages can be shared already
                continue
            req.append_token(tok)  # a request retracted meanwhile (waiting) keeps its token too
            if req.finish_reason is not None:
                self._finish(req, req.finish_reason)
                finished.append(req)
            elif not was_decode and req.status == ReqStatus.RUNNING:
                self.kv.cache_prefix(req, valid)  # lesson 5: later arrivals share this prompt at once
        return finished

    def step(self) -> list[Req]:
        """One iteration; returns the requests that finished in it.

        Synchronous (lesson 4): schedule, run and process one batch. With ``overlap`` (lesson
        7): schedule and launch the next batch, *then* process the batch launched by the
        previous call, whose tokens the device has produced meanwhile.

        If the forward pass or the sampler raises, the batch's requests are the ones that
        fail: they are returned finished with ``finish_reason == "error"`` and their KV freed,
        and the next step runs as if they had never been there. (An interrupt such as Ctrl-C
        is not caught here: whoever drives the loop cleans up its own requests.)"""
        finished: list[Req] = []
        had_previous = bool(self.in_flight)
        batch = self.schedule()
        launched = batch is not None and self._launch(batch, finished)
        # Overlap: process everything but the batch just launched. Synchronous: everything.
        keep = 1 if self.config.overlap and launched else 0
        while len(self.in_flight) > keep:
            finished += self._complete(*self.in_flight.popleft())
        if batch is None and not had_previous and self.has_work:  # add_request guarantees every request fits the empty pool
            raise RuntimeError(
                f"scheduler stalled: {len(self.waiting)} waiting, {len(self.running)} running, "
                f"{self.kv.allocator.num_free}/{self.num_pages} pages free (KV leak?)"
            )
        return finished

    def flush(self) -> list[Req]:
        """Process every batch still in flight (lesson 7); returns the requests they finished."""
        finished: list[Req] = []
        while self.in_flight:
            finished += self._complete(*self.in_flight.popleft())
        return finished

    def _launch(self, batch: Batch, finished: list[Req]) -> bool:
        """Launch ``batch`` and queue it in ``in_flight``; if launching raises, its requests fail
        (added to ``finished``) and this returns False."""
        self.launched(batch)
        try:
            future = self.engine.launch(batch)
        except Exception as exc:  # a kernel error, a sampler failure, ...: these requests fail alone
            logger.exception("batch of %d request(s) failed; finishing them with an error", batch.size)
            self._unlaunch(batch)
            finished += self.fail(batch.reqs, exc)
            return False
        except BaseException:  # Ctrl-C: nothing was launched; the caller cleans up its requests
            self._unlaunch(batch)
            raise
        self.in_flight.append((batch, future))
        return True

    def _complete(self, batch: Batch, future: StepFuture) -> list[Req]:
        try:
            tokens = future.result()
        except Exception as exc:
            logger.exception("batch of %d request(s) failed; finishing them with an error", batch.size)
            self._unlaunch(batch)
            return self.fail(batch.reqs, exc)
        except BaseException:  # Ctrl-C while waiting: the batch's results are dropped
            self._unlaunch(batch)
            raise
        return self.process(batch, tokens)

    def _unlaunch(self, batch: Batch) -> None:
        """A launched batch failed: it will produce nothing. Its rows are no longer in flight
        (their requests are about to fail; a deferred release happens here if it was the last)."""
        for req, samples in zip(batch.reqs, batch.samples):
            self._leave_batch(req, samples)

    def _leave_batch(self, req: Req, samples: bool) -> None:
        """``req``'s row of a launched batch is done (processed or failed): one batch fewer in
        flight, its token no longer pending; a release deferred by ``_finish`` happens now if
        this was the last batch that held the request."""
        req.pending -= samples
        req.inflight -= 1
        if req.status == ReqStatus.FINISHED and req.inflight == 0 and req.release_deferred is not None:
            self.kv.release_request(req, cache=req.release_deferred)
            req.release_deferred = None


def common_prefix_len(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n = min(len(a), len(b), limit)
    return next((i for i in range(n) if a[i] != b[i]), n)
