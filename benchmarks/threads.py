"""``python -m benchmarks threads``: the measurements behind the CPU thread policy of
:mod:`minisgl.cpu_threads` (each setting in a fresh process, on an idle machine and beside busy
processes); writes ``benchmarks/results/cpu_threads_cpu.json``."""

from __future__ import annotations

import os

from minisgl.cpu_threads import DEFAULT_THREADS, apply_cpu_thread_policy, torch_default_threads

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
        from benchmarks.offline import shape_checkpoint

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

    p = argparse.ArgumentParser(prog="python -m benchmarks threads", description="Measure the CPU thread policy: "
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
                        r = subprocess.run([sys.executable, "-m", "benchmarks.threads", "--one", model, str(batch),
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
