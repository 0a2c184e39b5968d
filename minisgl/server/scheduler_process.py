"""Lesson 10: the scheduler process. It owns the model, the KV pool and lessons 4-9's scheduler,
and runs one loop:

1. take every message waiting on its socket (new requests, aborts) without blocking while
   there is work, or wait for one while there is none;
2. run one scheduler step (with overlap, this launches step N+1 and processes step N), through
   :func:`~minisgl.scheduler.streaming.make_stepper`: in this process, or with ``--tp-size N``
   in every rank process;
3. send one :class:`StepOutput`: a :class:`~minisgl.scheduler.streaming.RequestEvent` for every
   request that got tokens or finished, and the engine's :class:`Stats`;
4. if a :class:`FlushCache` came (``/flush_cache``), empty the radix cache if no request runs or
   waits (in every rank under TP) and answer with a :class:`FlushResult`.

A request the engine refuses (too long for the pool, ids outside the vocabulary) gets an error
event with status 400; a request that fails while it runs (``finish_reason == "error"``) gets
one with status 500. Either way only that request ends; the loop goes on.
"""

from __future__ import annotations

__lesson__ = 10

import logging
import os
import signal

import zmq

from minisgl.scheduler.streaming import make_stepper
from minisgl.server.messages import (
    AbortRequest,
    AddRequest,
    FlushCache,
    FlushResult,
    Ready,
    Shutdown,
    Stats,
    StepOutput,
    decode,
    encode,
    pack,
    send_ready,
)
from minisgl.utils import set_process_name

logger = logging.getLogger(__name__)
IDLE_POLL_MS = 200  # how long the loop sleeps on its socket when there is nothing to run


class SchedulerServer:
    """The loop. The engine side is :func:`~minisgl.scheduler.streaming.make_stepper`'s (a
    :class:`~minisgl.scheduler.streaming.StreamingScheduler` here, or in every tensor-parallel
    rank, which then run the same step in lock step)."""

    def __init__(self, llm, recv: zmq.Socket, send: zmq.Socket) -> None:
        self.llm, self.recv, self.send = llm, recv, send
        self.engine = make_stepper(llm.core)
        self.parent = os.getppid()

    def run(self) -> None:
        has_work = False
        while os.getppid() == self.parent:  # the launcher gone: exit rather than linger
            add, abort, flush, keep_going = self.receive(block=not has_work)
            if not keep_going:
                return
            if add or abort or has_work:
                events, stats, has_work = self.engine.serve_step(add, abort)
                self.send.send(encode(StepOutput([pack(e) for e in events], pack(Stats(**stats)))))
            if flush is not None:  # after the requests that came before it: they count as running
                result = self.engine.flush_cache()
                self.send.send(encode(FlushResult(flush, result["ok"], result["message"], result["freed_pages"],
                                                  pack(Stats(**result["stats"])))))

    def receive(self, block: bool) -> tuple[list, list[str], str | None, bool]:
        """Every waiting message (waiting up to IDLE_POLL_MS for a first one if ``block``), up
        to and including a :class:`FlushCache`: requests to add, ids to abort, the id of a
        flush to run after them (or None), and False if told to shut down. Messages after a
        flush stay queued for the next call, so a request sent after a flush never stops it."""
        add: list[tuple[str, list[int], dict]] = []
        abort: list[str] = []
        if block and not self.recv.poll(IDLE_POLL_MS):
            return add, abort, None, True
        while True:
            try:
                message = decode(self.recv.recv(zmq.NOBLOCK))
            except zmq.Again:
                return add, abort, None, True
            if isinstance(message, Shutdown):
                return add, abort, None, False
            if isinstance(message, AddRequest):
                add.append((message.rid, message.prompt_ids, message.params))
            elif isinstance(message, AbortRequest):
                abort.append(message.rid)
            elif isinstance(message, FlushCache):
                return add, abort, message.fid, True


def run_scheduler(model: str, llm_settings: dict, recv_addr: str, send_addr: str, ready_addr: str) -> None:
    """Entry point of the scheduler process: build the LLM, say ready, loop until shut down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops us (Ctrl-C reaches the whole group)
    set_process_name("minisgl-sched")  # what ps and top show
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    context = zmq.Context()
    recv, send = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        import torch

        from minisgl.llm import LLM, default_device

        recv.bind(recv_addr)
        send.connect(send_addr)
        if (llm_settings.get("device") or default_device()).startswith("cuda") and llm_settings.get("tp_size", 1) == 1:
            # The host work of a step is small tensor ops, no faster on many threads, and an
            # OpenMP pool that spans every core fights the API and tokenizer processes for them.
            # H200 host, 16 cores, 128 streamed requests: 16 threads ran the server at 0.53x the offline
            # engine, 8 at 0.84x, 4 at 0.94x, 1 at 0.995x; the offline engine itself was as fast
            # on 1 thread as on 16. (Tensor-parallel ranks get cores / tp_size threads each.)
            torch.set_num_threads(1)
        llm = LLM(model, **llm_settings)
        server = SchedulerServer(llm, recv, send)
        info = {"max_seq_len": llm.max_seq_len, "num_pages": llm.num_pages, "page_size": llm.page_size,
                "device": llm.device}
        send.send(encode(Ready("scheduler", info)))  # the tokenizer worker waits for the context length
        send_ready(ready_addr, Ready("scheduler", info))
    except BaseException as exc:
        send_ready(ready_addr, Ready("scheduler", error=f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    try:
        server.run()
    finally:
        llm.close()
        recv.close(0)
        send.close(0)
        context.term()
