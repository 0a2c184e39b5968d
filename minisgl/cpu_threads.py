"""How many threads torch uses for a CPU run: one per process, unless you say otherwise.

torch's default on the CPU is one OpenMP thread per physical core. For the models this course
runs on a CPU that default is a trap: a decode step is hundreds of small ops (microseconds
each), and after every op the threads must all meet. With a second core free the split saves
a little; with that core busy (another process, the server's other processes, a test client)
a thread waits for a core at every op, and the whole step crawls. Measured on the course's
2-core machine, decode tok/s of the offline ``LLM`` (``python -m minisgl.bench.threads``; each
run a fresh process; "quiet" still had other users' work, load average about 2):

=========================  ==============  ==============  ===================
workload                   machine         2 threads       1 thread
=========================  ==============  ==============  ===================
tiny test model, bs=1      quiet           254             302
tiny test model, bs=1      + 1 busy proc   8.7             44
demo model, bs=1 (chat)    quiet           134             87
demo model, bs=1 (chat)    + 1 busy proc   3.5             22
demo model, bs=8           quiet           20              485
Qwen3-0.6B shape, bs=1     quiet           0.9             2.8
=========================  ==============  ==============  ===================

Two threads win only for one request of the demo model on a quiet machine (1.5x), and lose
6-24x as soon as anything else runs, including a second request. (``OMP_WAIT_POLICY=PASSIVE``
softens the cliff but needs setting before torch loads, and still lost at bs=8.) Results
files: ``benchmarks/results/cpu_threads_cpu.json``.

So :func:`apply_cpu_thread_policy` gives every CPU process of minisgl (the offline ``LLM``, the
server's scheduler, each tensor-parallel rank) :data:`DEFAULT_THREADS` thread, unless you chose:

1. the ``threads`` argument (the engine setting), if given;
2. the environment variable ``MINISGL_CPU_THREADS``;
3. ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment (torch already obeys them);
4. a ``torch.set_num_threads(n)`` call made before the policy ran (seen as a thread count that
   differs from torch's default).

In every one of those cases the policy leaves torch as you set it (or sets your number).
CUDA runs are not touched here: their host threads are the scheduler's business.
"""

from __future__ import annotations

__lesson__ = "assembly"

import os
from dataclasses import dataclass

ENV_VAR = "MINISGL_CPU_THREADS"
USER_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_THREADS = 1


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
    if current != torch_default_threads():
        return ThreadChoice(current, "torch.set_num_threads")
    return ThreadChoice(DEFAULT_THREADS, "default")


def apply_cpu_thread_policy(threads: int | None = None) -> ThreadChoice:
    """Set torch's thread count for a CPU run of this process, by the policy above; returns what
    was chosen (``.describe()`` says it in words). Call it once, before the model is built, in
    every process that runs the model on the CPU. Safe to call again (it is idempotent)."""
    import torch

    choice = choose_cpu_threads(threads)
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
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
