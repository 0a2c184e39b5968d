#!/usr/bin/env python3
"""Set up the course's environment and run it: ``python3 dev.py serve`` or ``python3 dev.py test``.

Needs only Python >= 3.10 (with its ``venv`` module) and pip's access to a package index.

Verbs:

* ``serve [ARGS]``  ``python -m minisgl [ARGS]``: with no ARGS, the bundled demo model on
  http://127.0.0.1:1919 (Ctrl-C stops it).
* ``test [ARGS]``   ``pytest [ARGS]``: with no ARGS, the whole suite, spread over one worker
  process per CPU core, up to ``MAX_TEST_WORKERS`` (pytest-xdist's ``-n``; each test file stays
  in one worker, so a file's servers start once); ``python3 dev.py test lessons/l05`` runs one
  lesson, in one process.
* ``site [ARGS]``   ``mkdocs [ARGS]``: with no ARGS, ``mkdocs serve`` (the course site on
  http://127.0.0.1:8000); ``python3 dev.py site build`` builds it into ``site-build/``.
* ``setup``         only create or update the environment.

Before any verb it makes sure the virtual environment exists and is installed exactly as
``.ci/run`` installs it (CPU torch first, then ``pip install -e ".[dev]"``, then SGLang's
benchmark client without its dependencies, see ``SGLANG``). The install is skipped when nothing
changed since the last one: a stamp file inside the environment records a hash of
``pyproject.toml``, the torch and SGLang requirements and the index used. A second run starts in
seconds; an edited ``pyproject.toml`` triggers a reinstall.

Environment variables (all optional):

* ``MINISGL_VENV``            where the virtual environment lives (default: ``.venv`` here).
* ``MINISGL_TORCH_INDEX_URL`` the index torch comes from. Unset on the course machines (their
  pip configuration already carries the CPU wheel). Elsewhere, use
  ``https://download.pytorch.org/whl/cpu`` for the CPU build: PyPI's Linux torch is the CUDA
  build and pulls several GB of ``nvidia-*`` libraries a CPU run never uses.
* ``MINISGL_EXTRAS``          the extras installed with the package (default: ``dev``; e.g.
  ``dev,cuda`` on a GPU machine).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TORCH = "torch==2.13.0"  # the CPU build, installed first; keep in step with .ci/run's comment
# SGLang's serving benchmark client, run against our server by tests/test_peer_clients.py (with
# the dev extras only). Installed with --no-deps: sglang requires CUDA torch, FlashInfer and
# dozens more that its client never imports; the few it does (aiohttp, pybase64, ...) are in
# the dev extras. 0.5.10.post1 is the newest release that is pure Python (one wheel, 6 MB, for
# every platform and Python); later ones ship compiled extensions in per-Python wheels.
SGLANG = "sglang==0.5.10.post1"
STAMP_NAME = ".minisgl-install-stamp"
# The tests run torch on one thread each (conftest.py), so one pytest process leaves every other
# core idle; the whole suite runs in this many workers at most (two cores: 400 s -> 310 s).
MAX_TEST_WORKERS = 4
VERBS = {"serve": ["-m", "minisgl"], "test": ["-m", "pytest"], "site": ["-m", "mkdocs"], "setup": []}
USAGE = "usage: python3 dev.py {serve|test|site|setup} [ARGS...]   (see the top of dev.py)"


def venv_dir() -> Path:
    return Path(os.environ.get("MINISGL_VENV") or ROOT / ".venv").resolve()


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def install_key() -> str:
    """What the install depends on: when it changes, the environment is reinstalled."""
    index = os.environ.get("MINISGL_TORCH_INDEX_URL", "")
    extras = os.environ.get("MINISGL_EXTRAS", "dev")
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    h.update(f"\n{TORCH}\n{SGLANG}\n{index}\n{extras}\n{ROOT}\n".encode())
    return h.hexdigest()


def say(message: str) -> None:
    print(f"[dev.py] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str]) -> None:
    say("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=ROOT)


def ensure_env() -> Path:
    """The environment's python, created and installed if missing or out of date."""
    venv = venv_dir()
    python = venv_python(venv)
    stamp = venv / STAMP_NAME
    key = install_key()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == key:
        return python
    if not python.exists():
        if sys.version_info < (3, 10):
            sys.exit(f"minisgl needs Python 3.10 or newer; this is {sys.version.split()[0]}")
        say(f"creating the virtual environment {venv}")
        try:
            run([sys.executable, "-m", "venv", str(venv)])
        except subprocess.CalledProcessError:
            sys.exit("could not create the virtual environment. On Debian/Ubuntu install the venv "
                     "module first: sudo apt install python3-venv")
    else:
        say("pyproject.toml (or the install settings) changed since the last install: reinstalling")
    stamp.unlink(missing_ok=True)
    pip = [str(python), "-m", "pip", "install"]
    index = os.environ.get("MINISGL_TORCH_INDEX_URL")
    run(pip + [TORCH] + (["--index-url", index] if index else []))
    extras = os.environ.get("MINISGL_EXTRAS", "dev")
    run(pip + ["-e", f".[{extras}]"])
    if "dev" in extras.split(","):
        run(pip + ["--no-deps", SGLANG])
    stamp.write_text(key + "\n")
    say(f"installed; the environment is {venv} (activate it with: . {venv}/bin/activate)")
    return python


def test_worker_args(cores: int) -> list[str]:
    """pytest's arguments for the whole suite on ``cores`` cores: one worker per core, up to
    ``MAX_TEST_WORKERS``, each test file in one worker (``--dist loadfile``); one core: none."""
    workers = min(cores, MAX_TEST_WORKERS)
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        print(USAGE, file=sys.stderr)
        return 2
    verb, rest = argv[0], argv[1:]
    python = ensure_env()
    if verb == "setup":
        return 0
    if verb == "site" and not rest:
        rest = ["serve"]
    if verb == "test" and not rest:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        rest = test_worker_args(cores)
    cmd = [str(python), *VERBS[verb], *rest]
    say("$ " + " ".join(cmd))
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's end-of-life banner
    env["VIRTUAL_ENV"] = str(venv_dir())
    env["PATH"] = str(python.parent) + os.pathsep + env.get("PATH", "")
    if os.name == "nt":
        return subprocess.call(cmd, cwd=ROOT, env=env)
    os.chdir(ROOT)
    os.execve(cmd[0], cmd, env)  # the server gets Ctrl-C and SIGTERM directly


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
