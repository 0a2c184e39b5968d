"""Many short Python runs from one warm interpreter: import the heavy libraries once, fork per run.

A test that needs a fresh process (lesson ``--mine`` runs, which modules a lesson's settings
load) pays for ``import torch`` and ``import transformers`` every time: about 3.5 s of a core,
more than most of those runs take. :func:`run_forked` starts **one** interpreter that imports
the libraries named in ``preload`` (third-party ones only: nothing of this repository, so each
run still starts with none of ``minisgl`` loaded), then forks a child per run. A child is a
fresh process as far as this repository's code goes: it has its own ``sys.argv``, working
directory and environment, its output goes to its own files, and it exits with its own code.

    results = run_forked([Run(["-m", "pytest", "lessons/l02", "-q"]), Run(["-c", "print(1)"])],
                         preload=("torch",), parallel=2)

Linux (``os.fork``) and the CPU only: a process that has initialised CUDA cannot fork.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """One run: ``args`` as after ``python`` (``["-m", "module", ...]``, ``["-c", "code", ...]`` or
    ``["script.py", ...]``), in ``cwd`` (default: the repository), with ``env`` (default: the
    environment :func:`run_forked` was given)."""

    args: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None


@dataclass
class Result:
    """What a run printed (stdout, then stderr) and its exit code; ``seconds`` of wall time."""

    returncode: int
    output: str
    seconds: float = 0.0
    stderr: str = field(default="", repr=False)


def run_forked(runs: list[Run], preload: tuple[str, ...] = ("torch", "transformers"), parallel: int = 2,
               env: dict[str, str] | None = None, timeout: float = 900) -> list[Result]:
    """Run ``runs`` (at most ``parallel`` at a time) as forked children of one interpreter that
    has imported ``preload``; the results in the order of ``runs``."""
    spec = {"runs": [asdict(r) for r in runs], "preload": list(preload), "parallel": parallel}
    proc = subprocess.run([sys.executable, "-m", "tests.tools.forkrun"], input=json.dumps(spec), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the fork runner failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return [Result(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


def _child(run: dict, out_path: str, err_path: str) -> None:
    """In the forked child: become the run, then exit with its code (never return)."""
    code = 1
    try:
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.chdir(run["cwd"] or REPO)
        if run["env"] is not None:
            os.environ.clear()
            os.environ.update(run["env"])
        args = run["args"]
        try:
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            elif args[0] == "-c":
                sys.argv = ["-c", *args[2:]]
                sys.path.insert(0, "")
                exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv = list(args)
                sys.path.insert(0, str(Path(args[0]).resolve().parent))
                runpy.run_path(args[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the run's own failure, reported like python does
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()  # the run's clean-ups (temporary checkpoints, ...)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    spec = json.loads(sys.stdin.read())
    for name in spec["preload"]:
        importlib.import_module(name)
    assert not any(m == "minisgl" or m.startswith("minisgl.") for m in sys.modules), "preload must not load minisgl"
    runs, parallel = spec["runs"], max(1, spec["parallel"])
    folder = tempfile.mkdtemp(prefix="minisgl-forkrun-")
    results: list[dict | None] = [None] * len(runs)
    running: dict[int, tuple[int, float]] = {}  # pid -> (run index, start)
    pending = list(range(len(runs)))
    sys.stdout.flush()
    sys.stderr.flush()
    while pending or running:
        while pending and len(running) < parallel:
            i = pending.pop(0)
            paths = (f"{folder}/{i}.out", f"{folder}/{i}.err")
            pid = os.fork()
            if pid == 0:
                _child(runs[i], *paths)
            running[pid] = (i, time.monotonic())
        pid, status = os.wait()
        i, start = running.pop(pid)
        out = Path(f"{folder}/{i}.out").read_text(errors="replace")
        err = Path(f"{folder}/{i}.err").read_text(errors="replace")
        results[i] = {"returncode": os.waitstatus_to_exitcode(status), "output": out + err,
                      "seconds": time.monotonic() - start, "stderr": err}
    for path in Path(folder).iterdir():
        path.unlink()
    os.rmdir(folder)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
