"""Lesson 10: start the server's processes, serve HTTP, stop everything.

:func:`serve` (what ``python -m minisgl`` runs):

1. starts the scheduler process (it loads the model) and waits until it says it is ready, or
   exits with the child's own error message if it could not start;
2. starts the tokenizer worker the same way;
3. serves HTTP in this process with uvicorn until SIGINT/SIGTERM (or a child dies);
4. stops the children: a :class:`Shutdown` message, then SIGTERM, then SIGKILL, within
   :data:`STOP_TIMEOUT_S` seconds in all.

Children are fresh interpreters (``python -m minisgl.server.child``: no inherited locks,
threads or CUDA state, and no pickle, see :mod:`minisgl.server.child`). They talk over ZMQ
``ipc://`` sockets in a private temporary directory. Each child also exits by itself if this
process disappears.
"""

from __future__ import annotations

__lesson__ = 10

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

from minisgl.cpu_threads import child_env
from minisgl.server.messages import Ready, Shutdown, decode, encode
from minisgl.utils import set_process_name

if TYPE_CHECKING:  # the API process imports FastAPI; the children never need it
    from minisgl.server.api import EngineClient

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
    """The running children, the addresses of their sockets, and what the scheduler reported."""

    processes: dict[str, subprocess.Popen]
    addresses: dict[str, str]
    info: dict[str, Any]
    workdir: str

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes.values())

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is not None]


def _spawn(role: str, spec: dict[str, Any], cpu_threads: int | None | bool = False) -> subprocess.Popen:
    """A fresh interpreter running ``minisgl.server.child`` (see there why not multiprocessing).
    ``cpu_threads``: ``False`` on CUDA (the environment is passed on as it is); otherwise the
    child gets the CPU thread policy of :mod:`minisgl.cpu_threads` as ``OMP_NUM_THREADS`` (the
    number itself if one is given), unless the user set ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
    if cpu_threads is not False:
        env = child_env(env, threads=cpu_threads)
    return subprocess.Popen([sys.executable, "-m", "minisgl.server.child", role, json.dumps(spec)],
                            env=env, stdin=subprocess.DEVNULL)


def _wait_ready(processes: dict[str, subprocess.Popen], ready: zmq.Socket) -> dict[str, dict[str, Any]]:
    """Each child's :class:`Ready` info, in whatever order they come; :class:`ChildStartError`
    naming the first child that reports an error, exits, or is not ready in time."""
    infos: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.poll(100):
            message = decode(ready.recv())
            assert isinstance(message, Ready) and message.name in processes, message
            if message.error:
                # It exits by itself; under load that can take longer (the caller's
                # stop_children ends it then): the error is what the user must see.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    processes[message.name].wait(5)
                raise ChildStartError(f"the {message.name} process failed to start:\n{message.error}")
            infos[message.name] = message.info
            if len(infos) == len(processes):
                return infos
            continue
        for name, process in processes.items():
            if name not in infos and process.poll() is not None:
                raise ChildStartError(f"the {name} process exited with code {process.returncode} before it was ready")
    waiting = ", ".join(name for name in processes if name not in infos)
    raise ChildStartError(f"the {waiting} process was not ready after {START_TIMEOUT_S:.0f} s")


def _runs_on_cpu(args: ServerArgs) -> bool:
    device = args.llm.get("device")
    if device is None:
        import torch

        return not torch.cuda.is_available()
    return str(device).startswith("cpu")


def start_children(args: ServerArgs) -> Children:
    """Start the scheduler and the tokenizer worker; return when both are ready."""
    from minisgl.model_path import resolve_model_path

    model_path = str(resolve_model_path(args.model))  # a bad --model fails here, before any process
    # On the CPU every child runs torch with the thread policy's count (one by default): the
    # scheduler's default of one thread per core fights the API and tokenizer processes, and a
    # 64-token answer of the demo model took 10x longer (see minisgl.cpu_threads).
    cpu_threads = args.llm.get("cpu_threads") if _runs_on_cpu(args) else False
    workdir = tempfile.mkdtemp(prefix="minisgl-ipc-")
    names = ("api_to_tok", "tok_to_api", "tok_to_sched", "sched_to_tok", "ready")
    addresses = {name: f"ipc://{workdir}/{name}" for name in names}
    children = Children({}, addresses, {}, workdir)
    context = zmq.Context.instance()
    ready = context.socket(zmq.PULL)
    ready.bind(addresses["ready"])
    try:
        # Both at once: the tokenizer worker loads its tokenizer while the scheduler loads the
        # model, then waits for the scheduler's first message (the context length).
        children.processes["scheduler"] = _spawn("scheduler", dict(
            model=model_path, llm_settings=args.llm, recv_addr=addresses["tok_to_sched"],
            send_addr=addresses["sched_to_tok"], ready_addr=addresses["ready"]), cpu_threads)
        children.processes["tokenizer"] = _spawn("tokenizer", dict(
            model_path=model_path, ready_addr=addresses["ready"],
            addresses={"from_api": addresses["api_to_tok"], "from_scheduler": addresses["sched_to_tok"],
                       "to_api": addresses["tok_to_api"], "to_scheduler": addresses["tok_to_sched"]}), cpu_threads)
        children.info = _wait_ready(children.processes, ready)["scheduler"]
    except BaseException:
        stop_children(children)
        raise
    finally:
        ready.close(0)
    return children


def stop_children(children: Children) -> None:
    """Ask, then terminate, then kill; every child is gone when this returns."""
    context = zmq.Context.instance()
    for name, address in (("tokenizer", children.addresses["api_to_tok"]), ("scheduler", children.addresses["tok_to_sched"])):
        if name in children.processes and children.processes[name].poll() is None:
            socket = context.socket(zmq.PUSH)
            socket.connect(address)
            socket.send(encode(Shutdown()))
            socket.close(linger=200)
    for wait_s, then in ((STOP_TIMEOUT_S / 2, "terminate"), (STOP_TIMEOUT_S / 4, "kill"), (1.0, None)):
        deadline = time.monotonic() + wait_s
        for process in children.processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        left = [p for p in children.processes.values() if p.poll() is None]
        if not left or then is None:
            break
        for process in left:
            getattr(process, then)()
    shutil.rmtree(children.workdir, ignore_errors=True)


def build_app(args: ServerArgs, children: Children, on_startup=None):
    from minisgl.server.api import EngineClient, create_app
    from minisgl.server.metrics import ServerMetrics

    client = EngineClient(children.addresses["api_to_tok"], children.addresses["tok_to_api"], ServerMetrics())
    return create_app(client, args.model_name, args.api_key, on_startup=on_startup,
                      max_model_len=children.info.get("max_seq_len"), tokenizer_source=args.model), client


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _uvicorn_server(app, args: ServerArgs, client: EngineClient):
    """A uvicorn server whose shutdown first ends every open request with a 503 "the server is
    shutting down": their responses finish within uvicorn's grace period, instead of being
    cancelled mid-stream after it (a cut connection for the client, a traceback in the log)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            client.end_all("the server is shutting down")
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1))


def serve(args: ServerArgs) -> int:
    """Run the server until SIGINT/SIGTERM or a child's death; returns the exit code."""
    set_process_name("minisgl-api")
    children = start_children(args)
    app, client = build_app(args, children)
    server = _uvicorn_server(app, args, client)
    child_died: list[str] = []

    def watch_children() -> None:  # a dead child means a dead engine: stop serving, say why
        while not server.should_exit:
            if not children.alive():
                child_died.extend(children.dead())
                server.should_exit = True
            time.sleep(0.5)

    threading.Thread(target=watch_children, daemon=True).start()
    logger.info("minisgl serving %s on http://%s:%d (%s, %d KV pages of %d tokens; Ctrl-C stops it)", args.model_name,
                args.host, args.port, children.info.get("device"), children.info.get("num_pages"),
                children.info.get("page_size"))
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
    children = start_children(args)
    started = threading.Event()
    app, client = build_app(args, children, on_startup=started.set)
    server = _uvicorn_server(app, args, client)
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
