"""How many threads torch uses for a CPU run: one per process, unless you say otherwise.

torch's default on the CPU is one OpenMP thread per physical core. For the models this course
runs on a CPU that default is a trap: a decode step is hundreds of small ops (microseconds
each), and after every op the threads must all meet. With a second core free the split saves
a little; with that core busy (another process, the server's other processes, a test client)
a thread waits for a core at every op, and the whole step crawls. Measured on the course's
2-core machine, decode tok/s of the offline ``LLM`` (``python -m minisgl.cpu_threads``; each
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


# --- the measurement behind the default: python -m minisgl.cpu_threads ----------------------------
# Each setting runs in a fresh process (OpenMP reads its environment once); "loaded" adds busy
# processes that each keep one core spinning, as other work on a learner's laptop does.
SETTINGS = {  # name -> environment for the measured process ("": removed)
    "torch default": {"MINISGL_CPU_THREADS": "", "OMP_NUM_THREADS": str(torch_default_threads()), "MKL_NUM_THREADS": ""},
    "1 thread": {"MINISGL_CPU_THREADS": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": ""},
    "minisgl default": {"MINISGL_CPU_THREADS": "", "OMP_NUM_THREADS": "", "MKL_NUM_THREADS": ""},
}
WORKLOADS = {  # name -> (model, batch size, new tokens)
    "tiny bs=1": ("tiny", 1, 64), "demo bs=1": ("demo", 1, 64), "demo bs=8": ("demo", 8, 32),
    "qwen3-0.6b bs=1": ("qwen3-0.6b", 1, 8),
}


def _measure_once(model: str, batch: int, new_tokens: int) -> dict:
    """One offline run in this process: decode tok/s of ``batch`` chat requests (greedy, EOS ignored)."""
    import time

    import torch

    apply_cpu_thread_policy()  # what LLM does; it leaves an OMP_NUM_THREADS setting alone
    from minisgl import LLM, SamplingParams

    kwargs: dict = {}
    if model == "tiny":
        from minisgl.testing import tiny_checkpoint

        model = str(tiny_checkpoint("qwen3"))
    elif model == "qwen3-0.6b":
        from minisgl.bench.offline import shape_checkpoint

        model, kwargs = str(shape_checkpoint("qwen3-0.6b")), dict(dummy_weights=True, num_pages=64)
    llm = LLM(model, device="cpu", **kwargs)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), progress=False)  # warm-up
    prompts = [[{"role": "user", "content": f"What is a KV cache? ({i})"}] for i in range(batch)]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, progress=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {"threads": torch.get_num_threads(), "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def _busy_fraction(seconds: float = 1.0) -> float:
    """How busy the machine's cores were over ``seconds`` (all processes, ours or not)."""
    import time

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    (t0, i0), _ = sample(), time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import platform
    import statistics
    import subprocess
    import sys
    import time

    p = argparse.ArgumentParser(prog="python -m minisgl.cpu_threads", description="Measure the CPU thread policy: "
                                "decode tok/s of offline runs with each thread setting, idle and loaded.")
    p.add_argument("--workloads", default="tiny bs=1,demo bs=1,demo bs=8,qwen3-0.6b bs=1",
                   help=f"comma-separated, from: {', '.join(WORKLOADS)}")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, from: {', '.join(SETTINGS)}")
    p.add_argument("--loads", default="0,1", help="busy processes running beside each run (comma-separated)")
    p.add_argument("--repeats", type=int, default=2, help="rounds; settings are interleaved within a round")
    p.add_argument("--out", default=None, help="write the results (JSON) here")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "BATCH", "TOKENS"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(_measure_once(a.one[0], int(a.one[1]), int(a.one[2]))))
        return 0
    runs = []
    for rep in range(a.repeats):
        for load in (int(x) for x in a.loads.split(",")):
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
            try:
                for workload in a.workloads.split(","):
                    model, batch, tokens = WORKLOADS[workload]
                    for setting in a.settings.split(","):
                        env = {k: v for k, v in {**os.environ, **SETTINGS[setting]}.items() if v != ""}
                        busy_before = _busy_fraction(0.5)
                        r = subprocess.run([sys.executable, "-m", "minisgl.cpu_threads", "--one", model, str(batch),
                                            str(tokens)], env=env, capture_output=True, text=True, timeout=900)
                        if r.returncode != 0:
                            raise SystemExit(f"{workload} / {setting} failed:\n{r.stderr[-3000:]}")
                        run = {"workload": workload, "setting": setting, "busy_processes": load, "round": rep,
                               "machine_busy_before": round(busy_before, 2), **json.loads(r.stdout.splitlines()[-1])}
                        runs.append(run)
                        print(f"load {load}  {workload:16s} {setting:16s} {run['threads']} threads "
                              f"{run['tok_s']:8.1f} tok/s  (machine {busy_before:.0%} busy before)", flush=True)
            finally:
                for b in busy:
                    b.kill()
                    b.wait()
    summary: dict = {}
    for run in runs:
        key = f"{run['workload']}, {run['busy_processes']} busy"
        summary.setdefault(key, {}).setdefault(run["setting"], []).append(run["tok_s"])
    for key, by_setting in summary.items():
        medians = {s: round(statistics.median(v), 1) for s, v in by_setting.items()}
        best = max(medians.values())
        summary[key] = {"median_tok_s": medians, "best": max(medians, key=medians.get),
                        "minisgl_default_vs_best": round(medians.get("minisgl default", 0) / best, 2) if best else None}
        print(f"{key:28s} " + "  ".join(f"{s}: {v}" for s, v in medians.items()))
    if a.out:
        import torch

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        data = {"benchmark": "cpu_threads", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit,
                "description": "Decode tok/s of the offline LLM on the CPU (float32, greedy, EOS ignored) with "
                               "each thread setting, a fresh process per run, idle and beside busy processes. "
                               "'machine_busy_before' includes other users' work.",
                "hardware": {"cpu": platform.machine(), "cpu_count": os.cpu_count(),
                             "torch_default_threads": torch_default_threads(), "python": platform.python_version(),
                             "torch": torch.__version__},
                "config": {"workloads": {w: WORKLOADS[w] for w in a.workloads.split(",")}, "settings": a.settings,
                           "loads": a.loads, "repeats": a.repeats, "minisgl_default_threads": DEFAULT_THREADS},
                "results": {"summary": summary, "runs": runs}}
        with open(a.out, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
