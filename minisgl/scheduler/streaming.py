"""Lesson 10: the scheduler driven one step at a time by named requests, reporting every token.

``LLM.generate`` (lesson 4) owns its requests from start to end. A server does not: requests
arrive and leave (finished, aborted) between any two steps, and clients want each token as soon
as it exists. :class:`StreamingScheduler` wraps a :class:`~minisgl.scheduler.scheduler.Scheduler`
for that: requests are known by a string id, :meth:`step` runs one iteration and returns a
:class:`~minisgl.scheduler.events.RequestEvent` for every request that got tokens or finished since the
last report.

It works on plain values (ids, dicts, lists), so the same events can cross a process boundary
as JSON (tensor-parallel ranks) or msgpack (the server) without a translation layer.
"""

from __future__ import annotations

__lesson__ = 10

import logging
from collections.abc import Sequence
from typing import Any

from minisgl.core import Req, ReqStatus
from minisgl.distributed.client import RankClient
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.events import SAMPLING_FIELDS, RequestEvent
from minisgl.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class StreamingScheduler:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.reqs: dict[str, Req] = {}
        self.reported: dict[str, int] = {}  # output tokens already reported, per request
        self.refused: list[RequestEvent] = []  # requests refused at add, reported at the next step

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self.refused)

    def add(self, rid: str, prompt_ids: list[int], params: dict[str, Any]) -> None:
        """Queue a request; one the scheduler refuses is reported as an error event (400)."""
        try:
            sampling = SamplingParams(**{k: v for k, v in params.items() if k in SAMPLING_FIELDS})
            req = self.scheduler.add_request(prompt_ids, sampling)
        except (ValueError, TypeError) as exc:
            self.refused.append(RequestEvent(rid, [], "error", len(prompt_ids), 0, str(exc), 400))
            return
        self.reqs[rid] = req
        self.reported[rid] = 0

    def abort(self, rid: str) -> None:
        """Drop ``rid`` and free its KV; unknown or finished ids are ignored (aborts may cross
        the request's end on the way)."""
        req = self.reqs.pop(rid, None)
        self.reported.pop(rid, None)
        if req is not None:
            self.scheduler.abort(req)

    def step(self) -> list[RequestEvent]:
        """One scheduler iteration (if there is work), then the events since the last call."""
        if self.scheduler.has_work:
            try:
                self.scheduler.step()  # a failing batch fails its own requests inside
            except Exception as exc:  # anything else (a bug): fail what runs, keep serving
                logger.exception("scheduler step failed; failing the %d live request(s)", len(self.reqs))
                self.scheduler.fail(list(self.reqs.values()), exc)
        events, self.refused = self.refused, []
        for rid, req in list(self.reqs.items()):
            done = self.reported[rid]
            new = req.output_ids[done:]
            finished = req.status == ReqStatus.FINISHED
            if not new and not finished:
                continue
            self.reported[rid] = done + len(new)
            logprobs = None if req.params.logprobs is None else req.output_logprobs[done:done + len(new)]
            events.append(RequestEvent(rid, list(new), req.finish_reason if finished else None, len(req.prompt_ids),
                                       req.num_cached_tokens or 0, req.error,
                                       500 if req.finish_reason == "error" else 200, logprobs))
            if finished:
                del self.reqs[rid], self.reported[rid]
        return events

    def serve_step(self, add: Sequence[tuple[str, list[int], dict]] = (),
                   abort: Sequence[str] = ()) -> tuple[list[RequestEvent], dict[str, int], bool]:
        """The server's engine loop, one call per iteration: queue ``add`` (``(rid, prompt ids,
        sampling params as a dict)``), abort the ``abort`` ids, run one step, and return the
        events, the engine's stats, and whether work remains."""
        for rid, prompt_ids, params in add:
            self.add(rid, list(prompt_ids), params)
        for rid in abort:
            self.abort(rid)
        events = self.step()
        return events, self.stats(), self.has_work

    def stats(self) -> dict[str, int]:
        """What ``/metrics`` reports about the engine: requests, KV pages, prefix-cache hits, and
        (lesson 12's speculative loop, which keeps ``acceptance``) verify rows by accepted tokens."""
        kv = self.scheduler.kv
        tree = getattr(kv, "tree", None)
        acceptance = getattr(self.scheduler.loop, "acceptance", None)
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "num_pages": kv.num_pages, "free_pages": kv.allocator.num_free,
                "cached_pages": tree.evictable_pages if tree is not None else 0,
                "prefix_hit_tokens": kv.stats.hit_tokens, "prefix_query_tokens": kv.stats.prompt_tokens,
                "spec_accepted": list(acceptance.histogram) if acceptance is not None else []}

    def flush_cache(self) -> dict[str, Any]:
        """Empty the radix cache (what SGLang's ``/flush_cache`` does), only while no request
        runs or waits: every page the tree holds then belongs to no request (nothing is locked),
        so evicting every unlocked node leaves the tree empty and every page free. While
        requests run, their prefixes are locked and their queue may need the cache: refused,
        nothing changes. Without a prefix cache there is nothing to clear: a success that does
        nothing. Returns ``ok``, a ``message``, ``freed_pages`` and the engine's ``stats``
        afterwards."""
        sched = self.scheduler
        clear_cache = getattr(sched.kv, "clear_cache", None)  # lesson 5's CacheManager has one
        if clear_cache is None:
            ok, message, freed = True, "no prefix cache (--no-prefix-cache): nothing to flush", 0
        elif sched.running or sched.waiting:
            ok, freed = False, 0
            message = (f"the cache was not flushed: {len(sched.running)} request(s) running and "
                       f"{len(sched.waiting)} waiting; a flush needs an idle engine")
        else:
            sched.flush()  # lesson 7: a batch still in flight may hold an aborted request's last pages
            freed = clear_cache()
            assert sched.kv.tree.total_pages == 0, "with no request, nothing in the tree is locked"
            ok, message = True, f"cache flushed: {freed} page(s) freed"
        return {"ok": ok, "message": message, "freed_pages": freed, "stats": self.stats()}


class RankStepper:
    """:class:`StreamingScheduler`'s server calls under tensor parallelism (lesson 9): every rank
    runs the same call on its own scheduler, in lock step, through the :class:`RankClient`."""

    def __init__(self, client: RankClient) -> None:
        self.client = client

    def serve_step(self, add: Sequence[tuple[str, list[int], dict]] = (),
                   abort: Sequence[str] = ()) -> tuple[list[RequestEvent], dict[str, int], bool]:
        reply = self.client.step(list(add), list(abort))
        return [RequestEvent(**e) for e in reply["events"]], reply["stats"], reply["has_work"]

    def flush_cache(self) -> dict[str, Any]:
        return self.client.flush_cache()


def make_stepper(core) -> StreamingScheduler | RankStepper:
    """The server's engine side for an ``LLM``'s engine: a :class:`StreamingScheduler` over the
    scheduler in this process, or, under tensor parallelism (lesson 9), a :class:`RankStepper`
    whose calls every rank runs in lock step. Both have ``serve_step`` and ``flush_cache``."""
    if isinstance(core, RankClient):
        return RankStepper(core)
    return StreamingScheduler(core.scheduler)
