"""What every benchmark runner shares: its command line's common flags (:func:`benchmark_parser`)
and its result file, numbers together with the hardware, commit and config that produced them
(:func:`write_result`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def benchmark_parser(name: str, doc: str | None, *, device: bool = True, seed: bool = True, threads: bool = True,
                     out: str = "benchmarks/results/<name>_<device>.json") -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks NAME``: the runner's docstring as its help, and the
    flags every runner means the same way (``--device``, ``--seed``, ``--threads`` for CPU runs,
    ``--out`` for the JSON file, defaulting to ``out``). The runner adds its own flags."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = parser.add_argument_group("common benchmark flags")
    if device:
        from minisgl.llm import default_device

        common.add_argument("--device", default=default_device(), help="cuda or cpu (default: cuda if there is a GPU)")
    if seed:
        common.add_argument("--seed", type=int, default=0, help="seed of the workload's random prompts")
    if threads:
        common.add_argument("--threads", type=int, default=1, help="torch threads of a CPU run")
    common.add_argument("--out", default=None, help=f"JSON result path (default {out})")
    return parser


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
        try:
            import flashinfer

            info["flashinfer"] = flashinfer.__version__
        except ImportError:
            pass
    return info


REPO = Path(__file__).resolve().parents[1]  # the clone's root: benchmarks/ and minisgl/ live there


def child_env(minisgl_tree: str | os.PathLike | None = None) -> dict[str, str]:
    """The environment for a benchmark that runs its own file in a child process: the clone's
    root on ``PYTHONPATH`` (for ``benchmarks``), after ``minisgl_tree`` when another checkout's
    ``minisgl`` is to be measured."""
    paths = [str(Path(minisgl_tree).resolve())] if minisgl_tree else []
    paths += [str(REPO), *filter(None, [os.environ.get("PYTHONPATH", "")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def git_commit() -> str:
    """The commit being measured: ``MINISGL_COMMIT`` if set (a copy of the tree on another
    machine may carry a stale .git), else ``git rev-parse`` (``-dirty`` with uncommitted changes)."""
    if os.environ.get("MINISGL_COMMIT"):
        return os.environ["MINISGL_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout
        return out.stdout.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_result(path: str | os.PathLike, benchmark: str, config: dict[str, Any], results: Any,
                 origin: dict[str, Any] | None = None) -> Path:
    """Write ``{benchmark, date, commit, hardware, config, results}`` as JSON and return the path.
    ``origin`` (``{"commit", "hardware"}``) stamps results summarised from runs made elsewhere
    with those runs' commit and machine instead of this checkout's and this machine's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": origin["commit"] if origin else git_commit(),
        "hardware": origin["hardware"] if origin else hardware(),
        "config": config,
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
