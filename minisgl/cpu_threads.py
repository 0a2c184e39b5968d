"""How many threads torch uses for a CPU run: one per process, chosen once, unless you say.

torch's default on the CPU is one OpenMP thread per physical core. For the models this course
runs on a CPU that default is a trap: a decode step is hundreds of small ops (microseconds
each), and after every op the threads must all meet. With a second core free the split saves
little; with that core busy (another process, the server's other processes, a test client) a
thread waits for a core at every op and the whole step crawls. Lesson 4's text has the
measurements (``python -m benchmarks threads``).

So :func:`apply_cpu_thread_policy` gives every CPU process of minisgl (the offline ``LLM``, the
server's scheduler, each tensor-parallel rank) :data:`DEFAULT_THREADS` thread, unless you chose:

1. the ``threads`` argument (the engine setting ``cpu_threads``), if given;
2. the environment variable ``MINISGL_CPU_THREADS``;
3. ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment (torch already obeys them);
4. a ``torch.set_num_threads(n)`` call made before the policy ran (seen as a thread count that
   differs from torch's default).

The choice is made once, when the engine is built; nothing changes it while the engine runs.
CUDA runs are not touched here: their host threads are the scheduler's business.
"""

from __future__ import annotations

__lesson__ = "assembly"

import os
from dataclasses import dataclass

ENV_VAR = "MINISGL_CPU_THREADS"
USER_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_THREADS = 1
_set_by_policy: int | None = None  # the count the policy itself set by default, if it did


@dataclass(frozen=True)
class ThreadChoice:
    """What the policy decided: ``threads`` torch threads, and who chose them."""

    threads: int
    source: str  # "setting", "MINISGL_CPU_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "torch.set_num_threads", "default"

    def describe(self) -> str:
        if self.source == "default":
            return (f"{self.threads} CPU thread (minisgl's default; set {ENV_VAR} or OMP_NUM_THREADS to change it)")
        return f"{self.threads} CPU thread{'s' if self.threads != 1 else ''} (from {self.source})"


def torch_default_threads() -> int:
    """The thread count torch picks when nobody sets one: one per physical core this process may
    run on (what ATen's OpenMP backend uses; hyperthreads do not count)."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # macOS, Windows
        return max(1, (os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo") as f:
            processor, physical = None, "0"
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "processor":
                    processor = int(value)
                elif key == "physical id":
                    physical = value
                elif key == "core id" and processor in allowed:
                    cores.add((physical, value))
    except OSError:
        pass
    return max(1, len(cores) or len(allowed))


def _parse_threads(value: object, name: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name} must be a positive integer number of threads, got {value!r}")
    return n


def choose_cpu_threads(threads: int | None = None, *, environ: dict[str, str] | None = None,
                       current: int | None = None) -> ThreadChoice:
    """The policy without side effects: how many threads, and why (see the module docstring).

    ``current`` is torch's thread count now (``None``: ask torch); when it differs from torch's
    default, somebody called ``torch.set_num_threads`` and that choice stands."""
    env = os.environ if environ is None else environ
    if threads is not None:
        return ThreadChoice(_parse_threads(threads, "cpu_threads"), "setting")
    if env.get(ENV_VAR, "").strip():
        return ThreadChoice(_parse_threads(env[ENV_VAR], ENV_VAR), ENV_VAR)
    if current is None:
        import torch

        current = torch.get_num_threads()
    for name in USER_ENV_VARS:
        if env.get(name, "").strip():
            return ThreadChoice(current, name)
    if current != torch_default_threads() and current != _set_by_policy:
        return ThreadChoice(current, "torch.set_num_threads")
    return ThreadChoice(DEFAULT_THREADS, "default")


def apply_cpu_thread_policy(threads: int | None = None) -> ThreadChoice:
    """Set torch's thread count for a CPU run of this process, by the policy above; returns what
    was chosen (``.describe()`` says it in words). Call it once, before the model is built, in
    every process that runs the model on the CPU. Safe to call again (it is idempotent)."""
    import torch

    global _set_by_policy
    choice = choose_cpu_threads(threads)
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    if choice.source == "default":
        _set_by_policy = choice.threads  # a later call must not take our own setting for the user's
    return choice


def child_env(env: dict[str, str] | None = None, threads: int | None = None) -> dict[str, str]:
    """The environment for a fresh CPU process of minisgl (a server child, a rank): the policy's
    thread count as ``OMP_NUM_THREADS`` (OpenMP reads it when torch loads, before any of our code
    runs). ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set by the user are passed on untouched,
    unless ``threads`` (an explicit setting) says otherwise."""
    env = dict(os.environ if env is None else env)
    if threads is None and any(env.get(name, "").strip() for name in USER_ENV_VARS):
        return env
    choice = choose_cpu_threads(threads, environ={k: v for k, v in env.items() if k not in USER_ENV_VARS},
                                current=torch_default_threads())
    env["OMP_NUM_THREADS"] = str(choice.threads)
    return env
