"""Host time per step: what the CPU spends on one engine step, and on what.

Two measurements:

* **scheduler host time** of a decode step (``Scheduler.schedule`` + ``Scheduler.process``:
  choosing the batch, building its inputs, booking the sampled tokens) with many requests of a
  long context decoding together; ``--compare-with DIR`` runs the same measurement, in a
  subprocess, on another checkout of minisgl (e.g. the lesson-6 commit) so the two numbers come
  from one run. This part only uses APIs that lesson 4 already had, so it runs on old trees.
* **where a bs=1 decode step goes** (``cProfile`` over a few hundred steps, current tree only):
  per step, the cumulative host time of the scheduler, the launch (planning attention, the
  input copy, the model's forward, the sampler) and, inside the forward, each kind of layer.
  Profiling slows Python down, so the shares matter more than the profiled milliseconds; the
  unprofiled ms/token is reported beside them.

    python -m benchmarks host                                    # this tree
    git worktree add /tmp/l06 a09cff5                               # the last lesson-6 commit
    python -m benchmarks host --compare-with /tmp/l06            # before / after in one run
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser, child_env
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, sync
from minisgl.llm import LLM
from minisgl.models.model import CausalLM
from minisgl.sampling_params import SamplingParams


def scheduler_host_ms(llm: LLM, num_requests: int, prompt_len: int, new_tokens: int) -> dict:
    """Mean host ms of ``schedule`` and of ``process`` over the decode steps in which all
    ``num_requests`` requests decode together (prompts of ``prompt_len`` tokens, no shared prefix)."""
    sched = llm.scheduler
    spans: dict[str, list[float]] = {"schedule": [], "process": []}
    modes: list[tuple[str, int]] = []
    real_schedule, real_process = sched.schedule, sched.process

    def schedule():
        t0 = time.perf_counter()
        batch = real_schedule()
        spans["schedule"].append(time.perf_counter() - t0)
        modes.append(("none", 0) if batch is None else (batch.mode, len(batch.reqs)))
        return batch

    def process(batch, tokens):
        t0 = time.perf_counter()
        out = real_process(batch, tokens)
        spans["process"].append(time.perf_counter() - t0)
        return out

    sched.schedule, sched.process = schedule, process
    vocab = llm.config.vocab_size
    prompts = [[(131 * i + 7 * j + 1) % vocab for j in range(prompt_len)] for i in range(num_requests)]
    try:
        llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True), progress=False)
    finally:
        del sched.schedule, sched.process  # back to the class's methods
    full = [i for i, (mode, size) in enumerate(modes) if mode == "decode" and size == num_requests]
    full = full[2:-2]  # leave out the first steps (warming up) and the last ones (requests leave)
    if not full:
        raise ValueError(f"no decode step with all {num_requests} requests: raise new_tokens ({new_tokens})")
    # process() calls line up with launched batches; in the overlap loop they lag by one, but
    # every full decode step is processed like every other, so the mean is the same.
    processes = spans["process"][: len(spans["schedule"])]
    mean = lambda xs: sum(xs) / len(xs) * 1e3  # noqa: E731
    return {"requests": num_requests, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "decode_steps": len(full),
            "schedule_ms": mean([spans["schedule"][i] for i in full]),
            "process_ms": mean([processes[i] for i in full if i < len(processes)])}


# Functions whose cumulative time per step the bs=1 profile reports, by label. Matched on
# (file name ending, function name); a label may collect several functions.
PROFILE_ROWS: list[tuple[str, str, str]] = [
    ("scheduler: schedule", "scheduler/scheduler.py", "schedule"),
    ("scheduler: process", "scheduler/scheduler.py", "process"),
    ("engine: launch (everything below)", "engine/overlap.py", "launch"),
    ("engine: launch (everything below)", "engine/engine.py", "step"),  # lesson 4's loop (no overlap)
    ("  plan attention", "attention/paged.py", "plan"),
    ("  copy inputs (pinned staging)", "engine/staging.py", "to_device"),
    ("  model forward (everything below)", "models/model.py", "forward"),
    ("    linear layers", "modules/linear.py", "forward"),
    ("    RMSNorm (plain and fused add)", "layers/norm.py", "forward"),
    ("    RMSNorm (plain and fused add)", "layers/norm.py", "add_and_norm"),
    ("    RoPE", "layers/rotary.py", "forward"),
    ("    attention (KV append + kernel)", "attention/flashinfer_backend.py", "forward"),
    ("    attention (KV append + kernel)", "attention/paged.py", "forward"),
    ("    SiLU-and-mul (MLP glue)", "torch/nn/functional.py", "silu"),
    ("  graph runner (lesson 8): can it take the batch?", "engine/graph.py", "can_run"),
    ("  graph runner (lesson 8): run, all of it", "engine/graph.py", "run"),
    ("    pad the batch's metadata", "attention/metadata.py", "padded"),
    ("    prepare attention (plan into the fixed buffers)", "attention/flashinfer_backend.py", "prepare"),
    ("    prepare attention (plan into the fixed buffers)", "attention/paged.py", "prepare"),
    ("    replay the graph", "torch/cuda/graphs.py", "replay"),
    ("  sampler", "engine/sampler.py", "sample"),
]


def profile_decode(llm: LLM, device: str, tokens: int) -> dict:
    """cProfile one bs=1 request decoding ``tokens`` tokens; host ms per step for each row of
    :data:`PROFILE_ROWS` (cumulative time; the model forward counted once, at its top level)."""
    vocab = llm.config.vocab_size
    prompt = [(5 * i + 11) % vocab for i in range(128)]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    llm.generate([[(t + 1) % vocab for t in prompt]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    profiler = cProfile.Profile()
    sync(device)
    start = time.perf_counter()
    profiler.enable()
    llm.generate([prompt], params, progress=False)
    profiler.disable()
    sync(device)
    elapsed = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    top_forward_line = inspect.unwrap(CausalLM.forward).__code__.co_firstlineno
    rows: dict[str, dict] = {}
    for label, file_end, name in PROFILE_ROWS:
        for (file, line, func), (_, ncalls, _, cumtime, _) in stats.items():
            if func != name or not file.replace("\\", "/").endswith(file_end):
                continue
            if label.strip().startswith("model forward") and line != top_forward_line:
                continue  # CausalLM.forward only, not the inner modules' forwards in the same file
            row = rows.setdefault(label, {"ms_per_step": 0.0, "calls_per_step": 0.0})
            row["ms_per_step"] += cumtime / tokens * 1e3
            row["calls_per_step"] += ncalls / tokens
    by_self_time = sorted(stats.items(), key=lambda kv: -kv[1][2])[:25]
    top = [{"function": f"{Path(file).name}:{line}({func})", "self_ms_per_step": tottime / tokens * 1e3,
            "calls_per_step": ncalls / tokens} for (file, line, func), (_, ncalls, tottime, _, _) in by_self_time]
    return {"tokens": tokens, "profiled_ms_per_step": elapsed / tokens * 1e3, "top_self_time": top,
            "rows": [{"what": label, **rows[label]} for label in dict.fromkeys(r[0] for r in PROFILE_ROWS)
                     if label in rows]}


def build(shape: str, device: str, dtype: torch.dtype, overlap: bool | None, **kw) -> LLM:
    model_dir, dummy, _ = benchmark_checkpoint(shape)
    if overlap is not None:  # an old tree (before lesson 7) has no overlap setting
        kw["overlap"] = overlap
    return LLM(Path(model_dir), device=device, dtype=dtype, dummy_weights=dummy, **kw)


def scheduler_runs(args, device: str, dtype: torch.dtype, has_overlap: bool) -> dict:
    """The scheduler measurement for each load in ``--loads`` (and overlap off/on if the tree has it)."""
    out = {}
    settings = [("overlap_off", False), ("overlap_on", True)] if has_overlap else [("synchronous", None)]
    for load in args.loads.split(","):
        num_requests, prompt_len = (int(x) for x in load.split("x"))
        for key, overlap in settings:
            llm = build(args.shape, device, dtype, overlap, max_running=num_requests,
                        max_seq_len=prompt_len + args.new_tokens + 8)
            llm.generate([[1 + i] * 64 for i in range(8)], SamplingParams(max_tokens=8, ignore_eos=True),
                         progress=False)  # warm-up
            out.setdefault(load, {})[key] = scheduler_host_ms(llm, num_requests, prompt_len, args.new_tokens)
            del llm
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return out


def has_setting(name: str) -> bool:
    """Whether this tree's engine has the setting ``name`` (an ``EngineConfig`` field; in trees
    from before the one config, an ``LLM`` keyword argument). --compare-with runs older trees."""
    try:
        from minisgl.engine.config import EngineConfig
    except ImportError:
        return name in inspect.signature(LLM.__init__).parameters
    return name in EngineConfig.__dataclass_fields__


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("host", __doc__, seed=False, out="benchmarks/results/host_<device>.json")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--loads", default="32x1024,256x1024",
                        help="comma-separated REQUESTSxPROMPT_LEN decode loads for the scheduler measurement")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--profile-tokens", type=int, default=200, help="bs=1 steps profiled (0: skip)")
    parser.add_argument("--compare-with", default=None, help="another minisgl checkout to measure the same way")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--scheduler-only-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device
    dtype = benchmark_dtype(device, args.threads)
    has_overlap = has_setting("overlap")
    tree = str(Path(sys.modules["minisgl"].__file__).resolve().parent.parent)
    if args.scheduler_only_json:  # the child of --compare-with: print the numbers, nothing else
        print(json.dumps({"tree": tree, "scheduler": scheduler_runs(args, device, dtype, has_overlap)}))
        return

    results: dict = {"scheduler": {args.label: {"tree": tree, **scheduler_runs(args, device, dtype, has_overlap)}}}
    if args.compare_with:
        env = child_env(args.compare_with)
        cmd = [sys.executable, "-P", __file__, "--scheduler-only-json", "--shape", args.shape, "--loads", args.loads,
               "--new-tokens", str(args.new_tokens), "--device", device, "--threads", str(args.threads)]
        child = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=args.compare_with)
        if child.returncode != 0:
            raise SystemExit(f"measuring {args.compare_with} failed:\n{child.stderr[-3000:]}")
        other = json.loads(child.stdout.strip().splitlines()[-1])
        results["scheduler"][f"compare: {args.compare_with}"] = {"tree": other["tree"], **other["scheduler"]}
    for label, entry in results["scheduler"].items():
        for load, settings in entry.items():
            if load != "tree":
                print(f"{label} {load}: " + ", ".join(f"{k} schedule {v['schedule_ms']:.3f} + process "
                                                     f"{v['process_ms']:.3f} ms" for k, v in settings.items()))
    if args.profile_tokens > 0:
        llm = build(args.shape, device, dtype, has_overlap or None, max_running=8, max_seq_len=128 + args.profile_tokens + 16)
        results["bs1_profile"] = profile_decode(llm, device, args.profile_tokens)
        from benchmarks.overlap import decode_ms_per_token  # (not at the top: older trees lack it)

        results["bs1_profile"]["unprofiled_ms_per_token"] = decode_ms_per_token(
            llm, device, args.profile_tokens, llm.config.vocab_size)
        for row in results["bs1_profile"]["rows"]:
            print(f"{row['what']:<40} {row['ms_per_step']:7.3f} ms  {row['calls_per_step']:6.1f} calls/step")
        print(f"profiled {results['bs1_profile']['profiled_ms_per_step']:.2f} ms/step, "
              f"unprofiled {results['bs1_profile']['unprofiled_ms_per_token']:.2f} ms/token")
    from benchmarks.cli import write_result

    config = {"shape": args.shape, "device": device, "dtype": str(dtype).replace("torch.", ""), "loads": args.loads,
              "new_tokens": args.new_tokens, "profile_tokens": args.profile_tokens,
              "compare_with": args.compare_with, "cpu_threads": torch.get_num_threads()}
    out = args.out or f"benchmarks/results/host_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'host', config, results)}")


if __name__ == "__main__":
    main()
