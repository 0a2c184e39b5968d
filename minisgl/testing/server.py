"""Lesson 10 test helpers: ``python -m minisgl`` as a real process on a real local port."""

from __future__ import annotations

__lesson__ = 'tooling'

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from minisgl.server.metrics import parse_metrics
from minisgl.testing.processes import child_pids, descendant_pids, process_alive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m minisgl --model MODEL --device DEVICE ARGS`` on a free port, as a context manager
    (``model=None``: no ``--model``, the default demo model).

    Entering waits until ``/health`` answers (or raises with the server's output if it exits);
    leaving sends SIGTERM and checks that the server and every process under it (children and
    theirs: a tensor-parallel server's ranks) exit within ``stop_timeout`` seconds
    (:attr:`stop_seconds` says how long it took). A thread keeps reading the server's output
    (:meth:`output`), so a long run never blocks on a full pipe.
    """

    def __init__(self, model: str | Path | None, *args: str, api_key: str | None = None, device: str = "cpu",
                 start_timeout: float = 120.0, stop_timeout: float = 5.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [sys.executable, "-m", "minisgl", "--port", str(self.port), "--device", device, *args]
        if model is not None:
            cmd += ["--model", str(model)]
        if api_key:
            cmd += ["--api-key", api_key]
        self.cmd, self.start_timeout, self.stop_timeout = cmd, start_timeout, stop_timeout
        self.proc: subprocess.Popen | None = None
        self.children: list[int] = []  # the server's own children (scheduler, tokenizer worker)
        self.descendants: list[int] = []  # every process under it (with tensor parallelism, the ranks too)
        self.stop_seconds: float | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ServerProcess:
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self._reader = threading.Thread(target=self._lines.extend, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout
        with httpx.Client(timeout=1) as http:  # one client for every poll (see wait_until_idle)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{self.output()}")
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        self.children = child_pids(self.proc.pid)
                        self.descendants = descendant_pids(self.proc.pid)
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        self._kill_all()
        raise RuntimeError(f"the server did not answer /health within {self.start_timeout} s")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig``; then assert that the server and its children are gone within the timeout."""
        if self.proc is None or self.proc.poll() is not None:
            return
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self._kill_all()
            raise AssertionError(f"the server did not exit within {self.stop_timeout} s of SIGTERM") from None
        while any(process_alive(p) for p in self.descendants) and time.monotonic() - start < self.stop_timeout:
            time.sleep(0.05)
        self.stop_seconds = time.monotonic() - start
        left = [p for p in self.descendants if process_alive(p)]
        assert not left, f"processes {left} started under the server still run after it exited"

    def _kill_all(self) -> None:
        """SIGKILL the server and every process under it (a server that failed to start or to
        stop must not leave its children running, orphaned, for the rest of the session)."""
        found = descendant_pids(self.proc.pid)  # read before the parent dies (then the children move to init)
        self.proc.kill()
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait(10)

    def output(self) -> str:
        """What the server printed so far (all of it, once it has exited)."""
        if self.proc is not None and self.proc.poll() is not None and self._reader is not None:
            self._reader.join(5)
        return "".join(self._lines)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=5).text)


def wait_until_idle(url: str, timeout: float = 10.0, headers: dict | None = None) -> dict[str, float]:
    """Poll ``/metrics`` until no request runs or waits and no KV page is held by a request;
    returns the metrics, or raises AssertionError with the last ones (a leak, or a stuck engine).
    One ``httpx.Client`` serves every poll: each ``httpx.get`` builds a client of its own, and
    its TLS setup (the CA certificates, read even for ``http://``) costs ~20 ms of CPU, which
    polls 20 times a second would take from the server under test."""
    deadline = time.monotonic() + timeout
    with httpx.Client(headers=headers or {}, timeout=5) as http:
        while True:
            m = parse_metrics(http.get(f"{url}/metrics").text)
            idle = m["minisgl_num_running_requests"] == 0 and m["minisgl_num_waiting_requests"] == 0
            if idle and m["minisgl_kv_pages_used"] == 0:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not idle after {timeout} s: {m['minisgl_num_running_requests']:.0f} running, "
                    f"{m['minisgl_num_waiting_requests']:.0f} waiting, {m['minisgl_kv_pages_used']:.0f} KV pages held")
            time.sleep(0.05)
