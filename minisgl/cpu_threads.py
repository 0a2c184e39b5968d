"""How many threads torch uses for a CPU run: one per process by default, a second core for
decode steps only while it is free and faster.

torch's default on the CPU is one OpenMP thread per physical core. For the models this course
runs on a CPU that default is a trap: a decode step is hundreds of small ops (microseconds
each), and after every op the threads must all meet. With a second core free the split saves
a little; with that core busy (another process, the server's other processes, a test client)
a thread waits for a core at every op, and the whole step crawls. Measured on the course's
2-core machine, decode tok/s of the offline ``LLM`` (``python -m benchmarks.threads``; each
run a fresh process, the median of two; "+1 busy" runs one spinning process beside it):

=========================  ============  ==============  ==========  ===============
workload                   machine       torch default   1 thread    minisgl default
=========================  ============  ==============  ==========  ===============
tiny test model, bs=1      idle          250             271         278
tiny test model, bs=1      + 1 busy      73              222         225
demo model, bs=1 (chat)    idle          100             130         137
demo model, bs=1 (chat)    + 1 busy      53              144         125
demo model, bs=8           idle          650             616         690
demo model, bs=8           + 1 busy      115             556         695
=========================  ============  ==============  ==========  ===============

(torch default: two threads here.) Two threads gain little even on an idle machine and lose
2-6x as soon as anything else runs. Results file: ``benchmarks/results/cpu_threads_cpu.json``;
runs on two shared cores move by 10-20% between runs.

So :func:`apply_cpu_thread_policy` gives every CPU process of minisgl (the offline ``LLM``, the
server's scheduler, each tensor-parallel rank) :data:`DEFAULT_THREADS` thread, unless you chose:

1. the ``threads`` argument (the engine setting), if given;
2. the environment variable ``MINISGL_CPU_THREADS``;
3. ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment (torch already obeys them);
4. a ``torch.set_num_threads(n)`` call made before the policy ran (seen as a thread count that
   differs from torch's default).

In every one of those cases the policy leaves torch as you set it (or sets your number). When
nobody chose, the offline engine (one process, no tensor parallelism) also adapts while it runs
(:class:`AdaptiveThreads`): decode steps use every core while no other process keeps one busy
and a short trial shows it is faster, and go back to one thread at once otherwise.
CUDA runs are not touched here: their host threads are the scheduler's business.
"""

from __future__ import annotations

__lesson__ = "assembly"

import os
import statistics
import time
from dataclasses import dataclass, field

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


# --- Adapting to the machine while it runs -----------------------------------------------------


def other_busy_cores(previous: tuple[float, float, float] | None) -> tuple[float | None, tuple[float, float, float]]:
    """How many cores other processes kept busy since ``previous`` (a sample this function
    returned), from ``/proc/stat`` and this process's own CPU time; ``None`` the first time or
    where ``/proc/stat`` does not exist (then nothing adapts)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None, (0.0, 0.0, 0.0)
    ticks = os.sysconf("SC_CLK_TCK")
    busy = (sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0.0)) / ticks  # all but idle, iowait
    times = os.times()
    sample = (time.monotonic(), busy, times.user + times.system)
    if previous is None or sample[0] - previous[0] <= 0:
        return None, sample
    others = (sample[1] - previous[1]) - (sample[2] - previous[2])
    return max(0.0, others / (sample[0] - previous[0])), sample


@dataclass
class AdaptiveThreads:
    """Chooses, step by step, between one thread and ``most`` threads for decode steps.

    Two threads win only when a core is free *and* the step's ops are big enough to split (the
    demo model at one request: about 1.5x); they lose badly as soon as another process wants
    that core (see the table above). So: one thread by default. When no other process has kept
    a core busy for the last :attr:`recheck_s` (``/proc/stat``), a decode step shape not yet
    judged (``rows`` requests) gets a trial: :attr:`trial_steps` steps at ``most`` threads, then
    the same number at one, and the faster wins for that shape. The verdict is re-tried after
    :attr:`retry_steps` steps, twice as long after each trial that one thread won (so a model
    that never gains pays for a trial less and less often). Another process taking a core, or
    a step at ``most`` threads slower than 1.5x the one-thread time, goes back to one thread at
    once. Prefill and mixed steps run at whatever was chosen last.
    """

    most: int
    trial_steps: int = 3
    retry_steps: int = 256
    recheck_s: float = 0.25
    threads: int = 1
    _sample: tuple[float, float, float] | None = None
    _core_free: bool = False
    _checked: float = 0.0
    _timings: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # (rows, threads) -> step seconds
    _verdict: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rows -> (threads, decided at, wait)
    _steps: int = 0
    _one_thread_s: float = float("inf")  # the last trial's one-thread step time
    steps_at: dict[int, int] = field(default_factory=dict)  # thread count -> steps run with it

    def _check_machine(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.recheck_s:
            return
        self._checked = now
        others, self._sample = other_busy_cores(self._sample)
        free = others is not None and others < 0.5
        if not free:  # what was measured on a free core no longer holds
            self._verdict = {r: v for r, v in self._verdict.items() if v[0] == 1}
            self._timings.clear()
        self._core_free = free

    def choose(self, rows: int, decode: bool) -> int:
        """The thread count for the next step (``rows`` requests; ``decode``: one token each)."""
        self._steps += 1
        self._check_machine()
        if not decode:
            return self.threads
        if not self._core_free:
            self.threads = 1
            return 1
        verdict = self._verdict.get(rows)
        if verdict is not None and self._steps - verdict[1] < verdict[2]:
            self.threads = verdict[0]
            return self.threads
        # trial: `most` threads first, then one, trial_steps steps each
        if len(self._timings.get((rows, self.most), [])) < self.trial_steps:
            self.threads = self.most
        elif len(self._timings.get((rows, 1), [])) < self.trial_steps:
            self.threads = 1
        else:
            fast = statistics.median(self._timings.pop((rows, self.most)))
            slow = statistics.median(self._timings.pop((rows, 1)))
            wait = self.retry_steps if verdict is None or verdict[0] == self.most else min(2 * verdict[2], 64 * self.retry_steps)
            self.threads = self.most if fast < slow else 1
            self._verdict[rows] = (self.threads, self._steps, wait if self.threads == 1 else self.retry_steps)
            self._one_thread_s = slow
        return self.threads

    def record(self, rows: int, decode: bool, threads: int, seconds: float) -> None:
        """The step chosen by :meth:`choose` took ``seconds``."""
        self.steps_at[threads] = self.steps_at.get(threads, 0) + 1
        if not decode or not self._core_free:  # trials compare steps on a free core only
            return
        verdict = self._verdict.get(rows)
        if verdict is None or self._steps - verdict[1] >= verdict[2]:
            self._timings.setdefault((rows, threads), []).append(seconds)
        elif threads > 1 and seconds > 1.5 * self._one_thread_s:
            self._verdict[rows] = (1, self._steps, self.retry_steps)  # the machine changed: back to one


class AdaptiveThreadForward:
    """An engine's ``forward(batch)`` (lesson 4) that first sets torch's thread count as
    :class:`AdaptiveThreads` chooses, then tells it how long the step took. It replaces the
    engine's bound method, so the runner (eager or lesson 8's graphs) stays what it is."""

    def __init__(self, forward, chooser: AdaptiveThreads) -> None:
        self.inner, self.chooser = forward, chooser

    def __call__(self, batch):
        import torch

        rows, decode = len(batch.reqs), batch.mode == "decode"
        threads = self.chooser.choose(rows, decode)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        logits = self.inner(batch)
        self.chooser.record(rows, decode, threads, time.perf_counter() - start)
        return logits
