"""Lesson 10: the scheduler process. It owns the model, the KV pool and lessons 4-9's scheduler,
and runs one loop:

1. take every message waiting on its socket (new requests, aborts) without blocking while
   there is work, or wait for one while there is none;
2. run one scheduler step (with overlap, this launches step N+1 and processes step N);
3. send a :class:`TokenEvent` for every request that got tokens or finished, and the engine's
   :class:`Stats`.

A request the engine refuses (too long for the pool, ids outside the vocabulary) gets an error
event with status 400; a request that fails while it runs (``finish_reason == "error"``) gets
one with status 500. Either way only that request ends; the loop goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal

import zmq

from minisgl.core import Req, ReqStatus
from minisgl.sampling_params import SamplingParams
from minisgl.server.messages import AbortRequest, AddRequest, Ready, Shutdown, Stats, TokenEvent, decode, encode

logger = logging.getLogger(__name__)
SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
IDLE_POLL_MS = 200  # how long the loop sleeps on its socket when there is nothing to run


class SchedulerServer:
    """The loop's state: the engine, the live requests by id, what was already reported."""

    def __init__(self, llm, recv: zmq.Socket, send: zmq.Socket) -> None:
        self.llm, self.scheduler = llm, llm.scheduler
        self.recv, self.send = recv, send
        self.reqs: dict[str, Req] = {}
        self.reported: dict[str, int] = {}  # tokens already sent, per request
        self.parent = os.getppid()

    def run(self) -> None:
        while os.getppid() == self.parent:  # the launcher gone: exit rather than linger
            if not self.receive(block=not self.scheduler.has_work):
                return
            if self.scheduler.has_work:
                try:
                    self.scheduler.step()  # a failing batch fails its own requests inside
                except Exception as exc:  # anything else (a bug): fail what runs, keep serving
                    logger.exception("scheduler step failed; failing the %d live request(s)", len(self.reqs))
                    self.scheduler.fail(list(self.reqs.values()), exc)
                self.report()

    def receive(self, block: bool) -> bool:
        """Handle every waiting message (waiting up to IDLE_POLL_MS for the first one if
        ``block``); False when told to shut down or the parent process is gone."""
        if block and not self.recv.poll(IDLE_POLL_MS):
            return os.getppid() == self.parent
        while True:
            try:
                raw = self.recv.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            message = decode(raw)
            if isinstance(message, Shutdown):
                return False
            if isinstance(message, AddRequest):
                self.add(message)
            elif isinstance(message, AbortRequest):
                self.abort(message.rid)

    def add(self, message: AddRequest) -> None:
        try:
            params = SamplingParams(**{k: v for k, v in message.params.items() if k in SAMPLING_FIELDS})
            req = self.scheduler.add_request(message.prompt_ids, params)
        except (ValueError, TypeError) as exc:  # refused before it ran: the client's fault
            self.emit(TokenEvent(message.rid, [], "error", len(message.prompt_ids), 0, str(exc), 400))
            self.emit_stats()
            return
        self.reqs[message.rid] = req
        self.reported[message.rid] = 0

    def abort(self, rid: str) -> None:
        req = self.reqs.pop(rid, None)
        self.reported.pop(rid, None)
        if req is not None:
            self.scheduler.abort(req)  # frees its KV (now, or when its batch in flight is processed)
            self.emit_stats()

    def report(self) -> None:
        """A TokenEvent per request with new tokens or a new end, then the stats."""
        for rid, req in list(self.reqs.items()):
            done = self.reported[rid]
            new = req.output_ids[done:]
            finished = req.status == ReqStatus.FINISHED
            if not new and not finished:
                continue
            self.reported[rid] = done + len(new)
            status = 500 if req.finish_reason == "error" else 200
            self.emit(TokenEvent(rid, new, req.finish_reason if finished else None, len(req.prompt_ids),
                                 req.num_cached_tokens or 0, req.error, status))
            if finished:
                del self.reqs[rid], self.reported[rid]
        self.emit_stats()

    def emit(self, event: TokenEvent) -> None:
        self.send.send(encode(event))

    def emit_stats(self) -> None:
        kv = self.scheduler.kv
        tree = getattr(kv, "tree", None)
        self.send.send(encode(Stats(
            running=len(self.scheduler.running), waiting=len(self.scheduler.waiting), num_pages=kv.num_pages,
            free_pages=kv.allocator.num_free, cached_pages=tree.evictable_pages if tree is not None else 0,
            prefix_hit_tokens=kv.stats.hit_tokens, prefix_query_tokens=kv.stats.prompt_tokens,
        )))


def run_scheduler(model: str, llm_settings: dict, recv_addr: str, send_addr: str, ready_conn) -> None:
    """Entry point of the scheduler process: build the LLM, say ready, loop until shut down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops us (Ctrl-C reaches the whole group)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    context = zmq.Context()
    recv, send = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        from minisgl.llm import LLM

        recv.bind(recv_addr)
        send.connect(send_addr)
        llm = LLM(model, **llm_settings)
        server = SchedulerServer(llm, recv, send)
        info = {"max_seq_len": llm.scheduler.config.max_seq_len, "num_pages": llm.pool.num_pages,
                "page_size": llm.page_size, "device": llm.device}
        ready_conn.send_bytes(encode(Ready("scheduler", info)))
    except BaseException as exc:
        ready_conn.send_bytes(encode(Ready("scheduler", error=f"{type(exc).__name__}: {exc}")))
        raise SystemExit(1)
    try:
        server.run()
    finally:
        llm.close()
        recv.close(0)
        send.close(0)
        context.term()
