"""Lesson 9: one process per tensor-parallel rank, started and stopped by the caller's ``LLM``.

The caller keeps the tokenizer and sends every rank the same commands (the same requests, in
the same order) over a pipe, as JSON: nothing that crosses a process boundary is unpickled.
Each rank joins the process group (gloo on the CPU, NCCL on the GPU), builds its slice of the
model and a complete scheduler, and runs the same steps; the collectives inside the model keep
them in lock step. Every rank answers every command; the caller checks that the ranks agree.

Failures: a command that fails the same way on every rank (a bad request) is raised in the
caller as that error and the ranks stay up. Anything else (a rank that dies, answers
differently, or fails alone while the others wait in a collective) stops every rank and raises
:class:`TPRankError` with the failing rank's message. Ranks ignore Ctrl-C; the caller stops them.
A rank never outlives the process that started it: the kernel kills it when that process dies
(:func:`~minisgl.utils.exit_with_parent`), even while it is stuck in a driver call, so a killed
caller (a server's scheduler process, after its launcher's stop timeout) leaves no rank holding
GPU memory.
"""

from __future__ import annotations

__lesson__ = 9

import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client, Listener, wait
from typing import Any

from minisgl.distributed.starter import StartedProcess, caller_pythonpath, process_starter
from minisgl.utils import exit_with_parent, freeze_for_exit, set_process_name

STOP_TIMEOUT_S = 5.0
FAILURE_GRACE_S = 3.0  # after one rank reports a failure, how long the others get to answer


class TPRankError(RuntimeError):
    """A tensor-parallel rank failed (or the ranks disagreed); every rank has been stopped."""


class RankCommandError(RuntimeError):
    """A command failed the same way on every rank (e.g. a bad request); the ranks are still up.
    ``kind`` is "ValueError" or "TypeError" when the ranks' exception is one of those, else its
    class name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _send(conn, message: dict) -> None:
    conn.send_bytes(json.dumps(message).encode())


def _error_reply(exc: BaseException) -> dict:
    """An exception as JSON: its class, the built-in error it is a kind of, message, traceback."""
    kind = next((base.__name__ for base in (ValueError, TypeError) if isinstance(exc, base)), type(exc).__name__)
    return {"ok": False, "type": type(exc).__name__, "kind": kind, "message": str(exc),
            "traceback": traceback.format_exc()}


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _rank_main(rank: int, size: int, port: int, worker: str, settings: dict, conn, rank_init: str | None,
               seed: int) -> None:
    """A rank process: join the group, build the worker (``"module:function"``, called with the
    settings; it returns the command handler and a ready message), then serve commands."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the caller, which stops us
    import torch
    import torch.distributed as dist

    from minisgl.distributed.tp import TPGroup, set_tp

    try:
        cuda = settings["device"].startswith("cuda")
        if cuda:
            torch.cuda.set_device(rank)
            settings["device"] = f"cuda:{rank}"
        # The ranks share the cores: with every rank's CPU ops on all of them, the host work
        # of a step (scheduling, index tensors) runs several times slower, even on GPUs. On the
        # CPU each rank takes the CPU thread policy's count (one unless the user chose).
        if cuda:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
        else:
            from minisgl.cpu_threads import apply_cpu_thread_policy

            apply_cpu_thread_policy(settings.get("cpu_threads"))
        # The group's key-value store is the caller's (see RankProcesses): it outlives every rank.
        store = dist.TCPStore("127.0.0.1", port, world_size=size, is_master=False)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=size)
        set_tp(TPGroup(rank, size))
        torch.manual_seed(seed)  # the same on every rank: unseeded sampling draws the same numbers
        if rank_init:
            _resolve(rank_init)(rank)
        handle, ready = _resolve(worker)(settings, rank, size)
        _send(conn, {"ok": True, "pid": os.getpid(), **ready})
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
        _send(conn, _error_reply(exc))
        return
    try:
        while True:
            try:
                command = json.loads(conn.recv_bytes())
            except EOFError:  # the caller is gone
                break
            if command.get("cmd") == "stop":
                break
            try:
                _send(conn, {"ok": True, **handle(command)})
            except BaseException as exc:  # noqa: BLE001
                _send(conn, _error_reply(exc))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


class RankProcesses:
    """``size`` rank processes; each builds ``worker(settings, rank, size)`` (a ``"module:function"``
    returning ``(handle, ready_info)``) and answers every command with ``handle(command)``.

    The ranks die with the thread that creates this object (see the module docstring): create
    it in a thread that lives as long as the ranks should, normally the main thread."""

    def __init__(self, size: int, worker: str, settings: dict[str, Any], rank_init: str | None = None,
                 seed: int = 0) -> None:
        # Each rank runs ``python -m minisgl.distributed.launcher``, forked from this process's
        # starter (an interpreter that imported torch once and never touched a GPU; see
        # minisgl.distributed.starter) or, where there is none, a fresh interpreter: no CUDA state
        # or threads inherited, and the caller's script is not imported again (which
        # multiprocessing's spawn would do). It connects back over a local socket with a key.
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        # The process group's rendezvous store (a TCP key-value server) lives here, not in rank 0:
        # NCCL's watchdog thread in every rank polls it until the rank exits, so a store that
        # went down with rank 0 would make the other ranks print errors on every shutdown.
        from torch.distributed import TCPStore

        self.store = TCPStore("127.0.0.1", 0, world_size=size, is_master=True, wait_for_workers=False)
        port = self.store.port
        env = dict(os.environ, MINISGL_RANK_AUTHKEY=authkey.hex(),
                   PYTHONPATH=caller_pythonpath())
        self.size = size
        self.procs: list[subprocess.Popen | StartedProcess] = []
        starter = process_starter()
        for rank in range(size):
            spec = dict(rank=rank, size=size, port=port, worker=worker, settings=settings, rank_init=rank_init,
                        seed=seed, address=list(listener.address), parent=starter.parent_pid)
            self.procs.append(starter.start("minisgl.distributed.launcher", [json.dumps(spec)], env))
        self.pids = [p.pid for p in self.procs]
        accepted: dict[int, Any] = {}

        def accept() -> None:
            try:
                while len(accepted) < size:
                    conn = listener.accept()
                    accepted[json.loads(conn.recv_bytes())["rank"]] = conn
            except OSError:  # the listener was closed: a rank died before connecting
                pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.2)
                dead = [r for r, p in enumerate(self.procs) if p.poll() is not None and r not in accepted]
                if dead:
                    code = self.procs[dead[0]].returncode
                    listener.close()
                    self.conns = list(accepted.values())
                    self.close()
                    raise TPRankError(f"tensor-parallel rank {dead[0]} exited with code {code} before it "
                                      f"connected (its error is printed above)")
        except BaseException:
            listener.close()
            if self.procs:
                self.conns = list(accepted.values())
                self.close()
            raise
        listener.close()
        self.conns = [accepted[r] for r in range(size)]
        self.ready = self._collect("start")

    def call(self, command: dict) -> list[dict]:
        """Send ``command`` to every rank; their replies, in rank order."""
        if not self.procs:
            raise TPRankError("the tensor-parallel ranks have been stopped")
        for conn in self.conns:
            _send(conn, command)
        return self._collect(command.get("cmd", "command"))

    def _collect(self, what: str) -> list[dict]:
        """One reply per rank. A command that failed identically everywhere is raised as is
        (the ranks stay up); a rank that died, or failed alone, stops every rank."""
        replies: list[dict | None] = [None] * self.size
        first_failure: float | None = None
        failed_in_order: list[int] = []  # the first rank to fail is the one to report
        try:
            while any(r is None for r in replies):
                waiting = [i for i, r in enumerate(replies) if r is None]
                ready = wait([self.conns[i] for i in waiting], timeout=0.5)
                for i in waiting:
                    if self.conns[i] in ready:
                        try:
                            replies[i] = json.loads(self.conns[i].recv_bytes())
                        except EOFError:
                            pass
                    if replies[i] is None and self.procs[i].poll() is not None:
                        replies[i] = {"ok": False, "type": "RankExited",
                                      "message": f"rank {i} exited with code {self.procs[i].returncode}"}
                    if replies[i] is not None and not replies[i]["ok"]:
                        failed_in_order.append(i)
                        first_failure = first_failure or time.monotonic()
                if first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_S:
                    break  # the others are stuck in a collective waiting for the failed rank
        except BaseException:  # Ctrl-C (or anything else) while the ranks work: stop them all,
            # at once: a rank in the middle of a command reads no "stop" before it is done
            self.close(graceful=False)
            raise
        failures = [(i, r) for i, r in enumerate(replies) if r is None or not r["ok"]]
        if not failures:
            return replies  # type: ignore[return-value]
        same = (all(r is not None for _, r in failures) and len(failures) == self.size
                and len({(r["type"], r["message"]) for _, r in failures}) == 1)
        if same and what != "start" and failures[0][1]["type"] != "RankExited":
            first = failures[0][1]
            raise RankCommandError(first["kind"], first["message"])
        self.close(graceful=False)  # some ranks may be stuck in a collective: no point asking them
        rank = failed_in_order[0] if failed_in_order else failures[0][0]
        reply = replies[rank] or {"type": "Timeout", "message": f"rank {rank} did not answer"}
        raise TPRankError(f"tensor-parallel rank {rank} failed during {what}: {reply['type']}: {reply['message']}"
                          + (f"\n{reply['traceback']}" if reply.get("traceback") else ""))

    def close(self, graceful: bool = True) -> None:
        """Stop every rank: ask (``graceful``), wait up to ``STOP_TIMEOUT_S``, then terminate
        and kill."""
        for conn in getattr(self, "conns", []) if graceful else []:
            try:
                _send(conn, {"cmd": "stop"})
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0.0)
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for conn in getattr(self, "conns", []):
            conn.close()
        self.procs, self.conns = [], []
        self.store = None  # every rank is gone: the store can stop


def main() -> None:
    """Entry point of a rank process (started by :class:`RankProcesses`)."""
    spec = json.loads(sys.argv[1])
    exit_with_parent(spec["parent"])  # a caller killed (e.g. a server's scheduler, by its launcher) takes its ranks along
    set_process_name(f"minisgl-rank{spec['rank']}")
    conn = Client(tuple(spec["address"]), authkey=bytes.fromhex(os.environ["MINISGL_RANK_AUTHKEY"]))
    _send(conn, {"rank": spec["rank"]})
    _rank_main(spec["rank"], spec["size"], spec["port"], spec["worker"], spec["settings"], conn, spec["rank_init"],
               spec["seed"])
    freeze_for_exit()  # done: skip the exit's garbage collection over torch's objects (see there)


if __name__ == "__main__":
    main()
