"""Lesson 9: start rank processes from a warm interpreter that has imported torch once.

A rank started as a new interpreter (``python -m minisgl.distributed.launcher``) spends about
3.3 s of a CPU core on ``import torch`` before it does anything else. A server with two ranks
pays it twice at every start, the tensor-parallel benchmark twelve times, the test suite sixty
times. The **starter** is one interpreter per caller process that imports torch once, touches
no GPU, then forks a child per rank on request: each child has torch already imported and
does everything else itself, CUDA included.

Forking is safe only before CUDA is initialised: the CUDA driver's state does not survive
``fork``, and a child of a process that used the GPU fails at its first CUDA call. The starter
never uses the GPU (it imports torch and waits), and the caller itself, which may well have
used a GPU, never forks: it asks the starter. The same goes for thread pools (OpenMP's, NCCL's):
the starter starts none, so a child inherits no half-held lock.

A child is a fresh process as far as the rank goes: it gets the caller's environment,
``sys.path``, working directory and standard output and error *at the time of the request*
(the file descriptors travel over a Unix socket, as ``subprocess`` would hand them down), runs
the module as ``__main__``, runs its ``atexit`` handlers and exits with the module's exit code.
Requests and replies are JSON: nothing that crosses the process boundary is unpickled.

Lifetime: the starter dies with the process that started it (:func:`~minisgl.utils.exit_with_parent`;
it is started from the main thread, which lives as long as the process) and each child with the
starter, so a killed caller still takes every rank with it. If the starter cannot be used (not
Linux, no ``fork``, called outside the main thread) :func:`process_starter` gives a
:class:`FreshInterpreter` instead, which starts each process as a new interpreter.
"""

from __future__ import annotations

__lesson__ = 9

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import Any

from minisgl.utils import exit_with_parent, set_process_name

PRELOAD = ("torch", "torch.distributed")  # imported by the starter: no GPU, no threads, no minisgl
MAX_MESSAGE = 1 << 20


class StartedProcess:
    """A process the starter forked, with the part of :class:`subprocess.Popen`'s interface the
    launcher uses: ``pid``, ``returncode``, ``poll()``, ``wait(timeout)``, ``terminate()``,
    ``kill()``. The starter (its parent) reaps it and reports its exit code."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # exited; the starter's report is on its way
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Starter:
    """The caller's handle on its starter process (``python -m minisgl.distributed.starter``).
    One per caller process (:func:`process_starter` makes it on first use, from the main thread).
    A reader thread takes the starter's reports: the pid of each forked child, and each exit."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, PYTHONPATH=caller_pythonpath())
        self.proc = subprocess.Popen([sys.executable, "-m", "minisgl.distributed.starter", str(os.getpid()),
                                      str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self.parent_pid = self.proc.pid  # the parent of every process it starts
        self.sock = ours
        self.lock = threading.Lock()
        self.children: dict[int, StartedProcess] = {}  # by pid, until their exit is reported
        self.started: dict[int, StartedProcess] = {}  # by request id, until start() takes it
        self.replied = threading.Condition(self.lock)
        self.next_id = 0
        self.alive = True
        threading.Thread(target=self._read, name="minisgl-starter-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self.lock:
                if not data:  # the starter is gone, and with it (parent-death signal) its children
                    self.alive = False
                    for child in self.children.values():
                        child._set_exit(-signal.SIGKILL)
                    self.replied.notify_all()
                    break
                message = json.loads(data)
                if "id" in message:  # a child forked: known by pid before its exit can be reported
                    child = StartedProcess(message["pid"], message["args"])
                    self.children[child.pid] = self.started[message["id"]] = child
                    self.replied.notify_all()
                else:
                    self.children.pop(message["pid"])._set_exit(message["code"])
        self.proc.wait()  # reap the starter

    def start(self, module: str, args: list[str], env: dict[str, str]) -> StartedProcess:
        """Fork ``python -m module *args`` from the starter, with ``env``, this process's
        ``sys.path`` and working directory, and its current standard output and error."""
        request = {"module": module, "args": args, "env": env, "path": sys.path, "cwd": os.getcwd()}
        with self.lock:
            if not self.alive:
                raise RuntimeError("the rank starter process has exited")
            request_id, self.next_id = self.next_id, self.next_id + 1
            socket.send_fds(self.sock, [json.dumps({"id": request_id, **request}).encode()],
                            [sys.stdout.fileno() if _has_fd(sys.stdout) else 1,
                             sys.stderr.fileno() if _has_fd(sys.stderr) else 2])
            while request_id not in self.started:
                if not self.alive:
                    raise RuntimeError("the rank starter process exited before it started the process")
                self.replied.wait(1.0)
            return self.started.pop(request_id)


def caller_pythonpath() -> str:
    """This process's ``sys.path`` (its folders) as ``PYTHONPATH``, for a new interpreter that
    must import what this one can."""
    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))


def _has_fd(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. pytest's captured streams
        return False
    return True


_starter: Starter | None = None
_starter_lock = threading.Lock()


def starter_available() -> bool:
    """Whether :func:`process_starter` forks from a starter here: Linux-like (``fork``, Unix
    sockets that carry file descriptors), called from the main thread (the starter dies with the
    thread that starts it), and not switched off with ``MINISGL_RANK_STARTER=0``."""
    return (hasattr(os, "fork") and hasattr(socket, "send_fds") and sys.platform.startswith("linux")
            and threading.current_thread() is threading.main_thread()
            and os.environ.get("MINISGL_RANK_STARTER", "1") != "0")


class FreshInterpreter:
    """Where there is no starter: each process a new interpreter (``subprocess.Popen``)."""

    @property
    def parent_pid(self) -> int:
        return os.getpid()

    def start(self, module: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdin=subprocess.DEVNULL)


def process_starter() -> Starter | FreshInterpreter:
    """What starts this process's ranks: its starter (made on first use) when
    :func:`starter_available`, else :class:`FreshInterpreter`. ``parent_pid`` is the pid of the
    started processes' parent, which each must watch with ``exit_with_parent``."""
    global _starter
    if not starter_available():
        return FreshInterpreter()
    with _starter_lock:
        if _starter is None or not _starter.alive:
            _starter = Starter()
        return _starter


# --- the starter process -------------------------------------------------------------------------

def _run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python -m module args`` and exit with its code (never
    return)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, *fds):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = [request["cwd"], *request["path"]]  # as ``python -m`` would
        os.chdir(request["cwd"])
        sys.argv = [request["module"], *request["args"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as python itself would
            traceback.print_exc()
        atexit._run_exitfuncs()  # as at any interpreter's exit (a rank's clean-ups, torch's)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    """The starter: ``python -m minisgl.distributed.starter CALLER_PID SOCKET_FD``."""
    caller, fd = int(sys.argv[1]), int(sys.argv[2])
    exit_with_parent(caller)
    set_process_name("minisgl-starter")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        importlib.import_module(name)
    import gc

    gc.freeze()  # the children share these pages; the collector would copy them all
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's exit wakes the loop
    open_socket = True
    while open_socket:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
            if not data:  # the caller closed its end (it exited): stop, and our children with us
                open_socket = False
            else:
                request = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _run_child(request, fds)
                for f in fds:
                    os.close(f)
                sock.send(json.dumps({"id": request["id"], "pid": pid,
                                      "args": [request["module"], *request["args"]]}).encode())
        while True:  # reap every child that exited and report it
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            try:
                sock.send(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass


if __name__ == "__main__":
    main()
