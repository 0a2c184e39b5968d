"""Lesson 10: start the server's processes, serve HTTP, stop everything.

:func:`serve` (what ``python -m minisgl`` runs):

1. starts the scheduler process (it loads the model) and waits until it says it is ready, or
   exits with the child's own error message if it could not start;
2. starts the tokenizer worker the same way;
3. serves HTTP in this process with uvicorn until SIGINT/SIGTERM (or a child dies);
4. stops the children: a :class:`Shutdown` message, then SIGTERM, then SIGKILL, within
   :data:`STOP_TIMEOUT_S` seconds in all.

Processes are started with ``spawn`` (a fresh interpreter: no inherited locks, threads or CUDA
state). They talk over ZMQ ``ipc://`` sockets in a private temporary directory. Each child also
exits by itself if this process disappears.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import zmq

from minisgl.server.messages import Ready, Shutdown, decode, encode
from minisgl.utils import set_process_name

logger = logging.getLogger("minisgl.server")
START_TIMEOUT_S = 600.0  # loading a large model (and capturing CUDA graphs) takes a while
STOP_TIMEOUT_S = 4.0


class ChildStartError(RuntimeError):
    """A child process failed to start; the message is its own."""


@dataclass
class ServerArgs:
    """What ``python -m minisgl`` takes. ``llm`` holds :class:`~minisgl.LLM` settings."""

    model: str = "demo"
    host: str = "127.0.0.1"
    port: int = 1919
    api_key: str | None = None
    served_model_name: str | None = None
    llm: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


@dataclass
class Children:
    """The running children and the addresses of their sockets."""

    processes: dict[str, mp.Process]
    addresses: dict[str, str]
    info: dict[str, Any]
    workdir: str

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes.values())

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if not p.is_alive()]


def _wait_ready(process: mp.Process, conn, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if conn.poll(0.1):
            ready = decode(conn.recv_bytes())
            assert isinstance(ready, Ready)
            if ready.error:
                process.join(5)
                raise ChildStartError(f"the {name} process failed to start:\n{ready.error}")
            return ready.info
        if not process.is_alive():
            raise ChildStartError(f"the {name} process exited with code {process.exitcode} before it was ready")
    raise ChildStartError(f"the {name} process was not ready after {START_TIMEOUT_S:.0f} s")


def start_children(args: ServerArgs) -> Children:
    """Start the scheduler, then the tokenizer worker; return when both are ready."""
    from minisgl.models.loader import resolve_model_path
    from minisgl.server.scheduler_process import run_scheduler
    from minisgl.server.tokenizer_worker import run_tokenizer_worker

    model_path = str(resolve_model_path(args.model))  # a bad --model fails here, before any process
    workdir = tempfile.mkdtemp(prefix="minisgl-ipc-")
    addresses = {name: f"ipc://{workdir}/{name}" for name in ("api_to_tok", "tok_to_api", "tok_to_sched", "sched_to_tok")}
    ctx = mp.get_context("spawn")
    processes: dict[str, mp.Process] = {}
    children = Children(processes, addresses, {}, workdir)
    try:
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        processes["scheduler"] = ctx.Process(
            target=run_scheduler, name="minisgl-scheduler", daemon=True,
            args=(model_path, args.llm, addresses["tok_to_sched"], addresses["sched_to_tok"], child_conn))
        processes["scheduler"].start()
        children.info = _wait_ready(processes["scheduler"], parent_conn, "scheduler")
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        tokenizer_addresses = {"from_api": addresses["api_to_tok"], "from_scheduler": addresses["sched_to_tok"],
                               "to_api": addresses["tok_to_api"], "to_scheduler": addresses["tok_to_sched"]}
        processes["tokenizer"] = ctx.Process(
            target=run_tokenizer_worker, name="minisgl-tokenizer", daemon=True,
            args=(model_path, children.info["max_seq_len"], tokenizer_addresses, child_conn))
        processes["tokenizer"].start()
        _wait_ready(processes["tokenizer"], parent_conn, "tokenizer")
    except BaseException:
        stop_children(children)
        raise
    return children


def stop_children(children: Children) -> None:
    """Ask, then terminate, then kill; every child is gone when this returns."""
    context = zmq.Context()
    for name, address in (("tokenizer", children.addresses["api_to_tok"]), ("scheduler", children.addresses["tok_to_sched"])):
        if name in children.processes and children.processes[name].is_alive():
            socket = context.socket(zmq.PUSH)
            socket.connect(address)
            socket.send(encode(Shutdown()))
            socket.close(linger=200)
    context.term()
    deadline = time.monotonic() + STOP_TIMEOUT_S / 2
    for process in children.processes.values():
        process.join(max(0.0, deadline - time.monotonic()))
    for process in children.processes.values():
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S / 4
    for process in children.processes.values():
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1)
    shutil.rmtree(children.workdir, ignore_errors=True)


def build_app(args: ServerArgs, children: Children, on_startup=None):
    from minisgl.server.api import EngineClient, create_app
    from minisgl.server.metrics import ServerMetrics

    client = EngineClient(children.addresses["api_to_tok"], children.addresses["tok_to_api"], ServerMetrics())
    return create_app(client, args.model_name, args.api_key, on_startup=on_startup), client


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve(args: ServerArgs) -> int:
    """Run the server until SIGINT/SIGTERM or a child's death; returns the exit code."""
    import uvicorn

    set_process_name("minisgl-api")
    children = start_children(args)
    app, client = build_app(args, children)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    child_died: list[str] = []

    def watch_children() -> None:  # a dead child means a dead engine: stop serving, say why
        while not server.should_exit:
            if not children.alive():
                child_died.extend(children.dead())
                server.should_exit = True
            time.sleep(0.5)

    threading.Thread(target=watch_children, daemon=True).start()
    logger.warning("minisgl serving %s on http://%s:%d (%s, %d KV pages of %d tokens)", args.model_name, args.host,
                   args.port, children.info.get("device"), children.info.get("num_pages"), children.info.get("page_size"))
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM ends like Ctrl-C: children stopped in order
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn shuts down gracefully, then raises the signal that stopped it again
    finally:
        stop_children(children)
        client.close()
    if child_died:
        logger.error("the %s process died; the server stopped", " and ".join(child_died))
        return 1
    return 0


@contextlib.contextmanager
def serve_in_thread(args: ServerArgs) -> Iterator[str]:
    """The server in a background thread of this process (children as usual); yields its base
    URL and stops everything on exit. For the chat shell and for tests that patch the API."""
    import uvicorn

    children = start_children(args)
    started = threading.Event()
    app, client = build_app(args, children, on_startup=started.set)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not started.wait(0.1):
            if not thread.is_alive():
                raise RuntimeError(f"the HTTP server could not start on {args.host}:{args.port}")
        while not server.started:
            time.sleep(0.01)
        yield f"http://{args.host}:{server.servers[0].sockets[0].getsockname()[1] if args.port == 0 else args.port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        stop_children(children)
        client.close()


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
