"""CUDA-graph benchmark: graphs on and off in one run (lesson 8).

Per model shape (random weights of the real shape, bf16 on CUDA, overlap on in both):

* **bs=1 decode** ms/token with ``cuda_graph_max_bs=0`` (eager) and the default (graphs), as
  in the overlap benchmark (prefill left out), against the HBM roofline (weights + KV read
  once per step over the copy bandwidth measured in the same run);
* **kernels per decode step**: ``torch.profiler`` over a stretch of bs=1 decode steps, eager
  and with graphs; the kernels of one step grouped by kind, with their device time;
* **where a bs=1 step's time goes with graphs** (``--timeline-processes N``, CUDA): in each of N
  fresh processes (the host's speed differs from process to process), the host's phases per
  step (schedule, launch, processing; unprofiled), the device's timeline (kernel time, the short
  gaps between a graph's kernels, the long ones where the device waited for the host) and the
  step's graph replayed back to back alone, over a one-token context;
* **the graphs' memory** (measured before the KV pool is sized) and the capture time;
* **which FlashInfer decode kernel** (``--attention-sweep``): the CUDA-core and the tensor-core
  decode kernels, each captured in a graph, per layer over batch sizes and context lengths, for
  the head layouts of Qwen3-0.6B (16 query heads over 8 KV heads) and Llama-3.1-8B (32 over 8);
  ``decode_uses_tensor_cores`` is chosen from it;
* **the offline yardstick** (Qwen3-0.6B shape): 256 requests of 100..1024 tokens, graphs off
  and on, two engines with the same KV pool, alternating over ``--yardstick-repeats`` workloads.

    python -m benchmarks graphs                          # GPU
    python -m benchmarks graphs --shapes tiny --yardstick-shape tiny --yardstick-requests 32 \\
        --yardstick-len 16,64 --decode-tokens 32 --graph-max-bs 8   # CPU: the runner runs eagerly
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.cli import REPO, benchmark_parser, child_env, write_result
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, empty_cache
from benchmarks.overlap import add_roofline, copy_bandwidth, decode_bytes, decode_ms_per_token, trace_steps
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams

# Kernel kinds by a piece of the kernel's name (first match wins), for the per-step breakdown.
KERNEL_KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("attention: decode kernel (CUDA cores)", ("BatchDecode", "batch_decode", "SingleDecode")),
    ("attention: prefill kernel (prefill, or decode on tensor cores)", ("BatchPrefill", "batch_prefill")),
    ("attention: merge of split-KV parts", ("MergeState", "merge_state")),
    ("attention: append + split-KV decode + merge, one kernel (Triton)", ("_append_decode_kernel",)),
    ("KV append", ("AppendPaged", "append_paged")),
    ("q/k norms + RoPE (fused)", ("qk_norm_rope",)),
    ("all-reduce + residual add + RMSNorm, one kernel (Triton, symmetric memory)", ("_all_reduce_add_norm",)),
    ("all-gather of the logits (Triton, symmetric memory)", ("_all_gather_last_dim",)),
    ("RMSNorm", ("RMSNorm", "rmsnorm", "Norm")),
    ("RoPE", ("Rope", "rope", "Rotary")),
    ("SiLU-and-mul", ("act_and_mul", "silu", "Silu")),
    ("all-reduce / all-gather (NCCL)", ("nccl",)),
    ("all-reduce (symmetric memory)", ("one_shot_all_reduce", "two_shot_all_reduce")),
    ("MoE: router top-k, grouping, experts, top-k sum (Triton)", ("_topk_kernel", "_group_kernel", "_gate_up_",
                                                                  "_down_kernel", "_down_gemv", "_sum_top_k")),
    ("matmul (GEMM/GEMV)", ("gemm", "gemv", "Gemm", "Gemv", "cutlass", "sm90_xmma", "nvjet", "cublas", "splitK")),
    ("sampling (argmax)", ("argmax", "ArgMax", "reduce_kernel")),
    ("copy / index / elementwise", ("copy", "Copy", "index", "Index", "elementwise", "fill", "Fill", "cat", "gather",
                                    "scatter", "Memcpy", "memcpy", "Memset")),  # memcpy128: a bf16 tensor copy
]


# Between two kernels of a replayed graph the device needs well under a microsecond to a couple
# (H100); a gap this long or longer means the device had nothing to run: it waited for the host.
HOST_WAIT_GAP_US = 4.0


def kernel_kind(name: str) -> str:
    return next((kind for kind, keys in KERNEL_KINDS if any(k in name for k in keys)), "other")


def kernels_per_decode_step(llm: LLM, steps: int = 20, top_names: int = 0) -> dict:
    """Profile ``steps`` bs=1 decode steps (one request, after its prefill): CUDA kernels per
    step, grouped by kind, with their device time per step (µs) (and each kind's ``top_names``
    costliest kernels)."""
    vocab = llm.config.vocab_size
    prompt = [(11 * i + 5) % vocab for i in range(64)]
    llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)  # warm-up
    prof = profile_decode_steps(llm, [(t + 1) % vocab for t in prompt], steps, unprofiled=4, max_tokens=steps + 8)
    return kernels_by_kind(prof, steps, top_names)


def profile_decode_steps(llm: LLM, prompt: list[int], steps: int, unprofiled: int, max_tokens: int):
    """One request of ``max_tokens`` tokens after ``prompt``: its first ``unprofiled`` steps
    (prefill and a few decode steps) run plain, the next ``steps`` under ``torch.profiler``
    (CUDA activity), the rest to the end. Returns the profiler."""
    from torch.profiler import ProfilerActivity, profile

    sched = llm.scheduler
    req = sched.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    for _ in range(unprofiled):
        sched.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            sched.step()
        torch.cuda.synchronize()
    while sched.has_work:
        sched.step()
    sched.flush()
    assert req.finish_reason == "length"
    return prof


def kernels_by_kind(prof, steps: int, top_names: int = 0) -> dict:
    """The CUDA kernels of a ``torch.profiler`` run over ``steps`` steps, grouped by kind: kernels
    and device µs per step; with ``top_names``, also each kind's costliest kernel names."""
    counts: dict[str, int] = defaultdict(int)
    micros: dict[str, float] = defaultdict(float)
    names: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = kernel_kind(event.name)
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        counts[kind] += 1
        micros[kind] += us
        names[kind][event.name[:120]] += us
    by_kind = {}
    for kind in sorted(counts, key=lambda k: -micros[k]):
        by_kind[kind] = {"kernels_per_step": counts[kind] / steps, "us_per_step": micros[kind] / steps}
        if top_names:
            costliest = sorted(names[kind].items(), key=lambda item: -item[1])[:top_names]
            by_kind[kind]["top_kernels_us_per_step"] = {name: us / steps for name, us in costliest}
    return {"steps": steps, "kernels_per_step": sum(counts.values()) / steps, "by_kind": by_kind}


def device_timeline(kernels: list[tuple[float, float]], steps: int) -> dict:
    """Where the device's time went over ``steps`` steps, from every kernel's ``(start_us, end_us)``
    (any order), per step: the kernels' own time, the short gaps between them (under
    ``HOST_WAIT_GAP_US``: the device starting a graph's next kernel) and the long ones (the
    device idle, waiting for the host to hand it work). A gap is measured from the end of the
    last kernel still running, so overlapping kernels count none."""
    spans = sorted(kernels)
    gaps, busy_until = [], spans[0][1] if spans else 0.0
    for start, end in spans[1:]:
        gaps.append(max(0.0, start - busy_until))
        busy_until = max(busy_until, end)
    waits = [g for g in gaps if g >= HOST_WAIT_GAP_US]
    return {"steps": steps, "kernels_per_step": len(spans) / steps,
            "kernel_us_per_step": sum(end - start for start, end in spans) / steps,
            "launch_gap_us_per_step": sum(g for g in gaps if g < HOST_WAIT_GAP_US) / steps,
            "host_wait_us_per_step": sum(waits) / steps, "host_waits_per_step": len(waits) / steps}


class _TimedGraph:
    """Stands in for a captured graph: each ``replay()`` notes the host's clock at the call and
    records CUDA events around the replay on the device (:func:`graph_replays`)."""

    def __init__(self, graph, log: list) -> None:
        self.graph, self.log = graph, log

    def replay(self) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        called = time.perf_counter()
        start.record()
        self.graph.replay()
        end.record()
        self.log.append((called, start, end))


def graph_replays(llm: LLM, tokens: int = 200, skip: int = 20) -> dict:
    """One request of ``tokens`` tokens decoding through the graphs, unprofiled; per step (after
    ``skip``), medians in ms of: the graph on the device (``graph_ms``, events around its
    replay), the device's time from one graph's end to the next one's start (``between_ms``: the
    next step's input copies, or the device waiting), one graph's start to the next's
    (``cycle_ms``), and ``host_lead_ms``, how long before the previous graph ended the host called
    the next ``replay()``: positive, the host is ahead and the device sets the pace; negative,
    the device sat idle waiting for the host. ``host_behind_fraction``: the steps where it did."""
    runner = llm.engine.runner
    log: list = []
    originals = [dict(slot.graphs) for slot in runner.slots]
    for slot in runner.slots:
        slot.graphs = {b: _TimedGraph(g, log) for b, g in slot.graphs.items()}
    try:
        torch.cuda.synchronize()
        reference = torch.cuda.Event(enable_timing=True)
        reference.record()
        t_ref = time.perf_counter()
        vocab = llm.config.vocab_size
        llm.generate([[(3 * i + 11) % vocab for i in range(128)]], SamplingParams(max_tokens=tokens, ignore_eos=True),
                     progress=False)
        torch.cuda.synchronize()
    finally:
        for slot, graphs in zip(runner.slots, originals):
            slot.graphs = graphs
    steps = [((called - t_ref) * 1e3, reference.elapsed_time(start), reference.elapsed_time(end))
             for called, start, end in log[skip:]]
    pairs = list(zip(steps, steps[1:]))
    leads = [prev[2] - nxt[0] for prev, nxt in pairs]
    return {"steps": len(steps), "graph_ms": statistics.median(end - start for _, start, end in steps),
            "between_ms": statistics.median(nxt[1] - prev[2] for prev, nxt in pairs),
            "cycle_ms": statistics.median(nxt[1] - prev[1] for prev, nxt in pairs),
            "host_lead_ms": statistics.median(leads), "host_behind_fraction": sum(lead < 0 for lead in leads) / len(leads)}


def bs1_timeline(llm: LLM, steps: int = 60, replays: int = 50) -> dict:
    """One request decoding through the graphs (CUDA), four ways:

    * ``host_ms``: the median host time per step of the scheduler's ``schedule``, the engine's
      ``launch`` and the loop's processing (which waits for the step's tokens), and of a whole
      ``cycle``, unprofiled (:func:`~benchmarks.overlap.trace_steps`);
    * ``replays``: :func:`graph_replays`, the graphs on the device against the host's calls;
    * ``device``: :func:`device_timeline` of ``steps`` steps under ``torch.profiler`` (which
      slows the host: its waits are longer than unprofiled ones; the kernels are the same);
    * ``replay_alone_ms``: the 1-row graph replayed ``replays`` times back to back with nothing
      else, on the scratch page (a context of one token), ms per replay: the device's floor for
      the step's kernels, attention over a real context aside; and ``replay_host_us``, the
      host's median time in one ``replay()`` call (cudaGraphLaunch)."""
    vocab = llm.config.vocab_size
    trace_steps(llm, "cuda", num_requests=1, prompt_len=128, new_tokens=8, first=0, count=1)  # warm-up
    traced = trace_steps(llm, "cuda", num_requests=1, prompt_len=128, new_tokens=steps + 30, first=20, count=steps)
    host = {k: statistics.median(s[k][1] - s[k][0] for s in traced) for k in ("schedule", "launch", "process")}
    host["cycle"] = statistics.median(b["schedule"][0] - a["schedule"][0] for a, b in zip(traced, traced[1:]))
    replays_seen = graph_replays(llm)

    prof = profile_decode_steps(llm, [(5 * i + 2) % vocab for i in range(128)], steps, unprofiled=10,
                                max_tokens=steps + 30)
    kernels = [(e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3) for e in prof.profiler.kineto_results.events()
               if e.device_type() == torch.autograd.DeviceType.CUDA]

    runner = llm.engine.runner
    bucket = runner.bucket_for(1)
    slot = runner.slots[0]
    variant = slot.attention.prepare(runner._scratch_meta(bucket))  # the replays write KV only into the scratch page
    graph = slot.graphs[bucket, variant]
    host_us = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        host_us.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    alone_ms = (time.perf_counter() - t0) / replays * 1e3
    return {"host_ms": host, "replays": replays_seen, "device": device_timeline(kernels, steps),
            "replay_alone_ms": alone_ms, "replay_host_us": statistics.median(host_us), "sm_clock_mhz": sm_clock_mhz(),
            "cpu_core": cpu_core()}


def sm_clock_mhz() -> int | None:
    """The GPU's SM clock now (NVML, through torch), or None where NVML is missing."""
    try:
        return torch.cuda.clock_rate()
    except Exception:  # no pynvml / nvidia-ml-py in this environment
        return None


def cpu_core() -> int | None:
    """The CPU core this process last ran on (Linux: /proc/self/stat), or None elsewhere."""
    try:
        return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def timeline_in_processes(shape: str, device: str, processes: int, decode_tokens: int) -> list[dict]:
    """:func:`bs1_timeline` and the bs=1 ms/token with graphs, each in a fresh process of this
    file (one after the other): the host's speed is a property of the process."""
    cmd = [sys.executable, "-P", __file__, "--timeline-only-json", "--shapes", shape, "--device", device,
           "--decode-tokens", str(decode_tokens)]
    runs = []
    for i in range(processes):
        child = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, cwd=REPO)
        if child.returncode != 0:
            raise SystemExit(f"timeline process {i} failed:\n{child.stderr[-3000:]}")
        run = json.loads(child.stdout.strip().splitlines()[-1])
        runs.append(run)
        host, dev, seen = run["host_ms"], run["device"], run["replays"]
        print(f"  process {i}: {run['ms_per_token']:.2f} ms/token; the graph alone {run['replay_alone_ms']:.2f} ms/step, "
              f"served {seen['graph_ms']:.2f} + {seen['between_ms']:.2f} between graphs; the host calls replay "
              f"{seen['host_lead_ms']:.2f} ms before the previous graph ends (behind in "
              f"{seen['host_behind_fraction']:.0%} of steps); profiled kernels {dev['kernel_us_per_step'] / 1e3:.2f} ms + "
              f"gaps {dev['launch_gap_us_per_step'] / 1e3:.2f}; host cycle {host['cycle']:.2f} ms "
              f"(schedule {host['schedule']:.2f}, launch {host['launch']:.2f}, process {host['process']:.2f}); "
              f"CPU core {run['cpu_core']}, SM clock {run['sm_clock_mhz']} MHz")
    return runs


def build(shape: str, device: str, dtype: torch.dtype, graph_max_bs: int | None, **kw) -> LLM:
    model_dir, dummy, _ = benchmark_checkpoint(shape)
    if graph_max_bs is not None:  # None: a tree from before lesson 8 (no such setting)
        kw["cuda_graph_max_bs"] = graph_max_bs
    return LLM(Path(model_dir), device=device, dtype=dtype, dummy_weights=dummy, **kw)


def kernels_of_other_tree(tree: str, shapes: list[str], device: str) -> dict:
    """Kernels per eager bs=1 decode step measured on another checkout (e.g. lesson 7's, before
    this lesson's fused kernels), in a subprocess of this run."""
    env = child_env(tree)
    cmd = [sys.executable, "-P", __file__, "--kernels-only-json", "--shapes", ",".join(shapes), "--device", device]
    child = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if child.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def decode_kernel_sweep(device: str, batch_sizes=(1, 4, 16, 64), contexts=(128, 1024, 4096, 32768),
                        page_size: int = 16, replays: int = 20, calls_per_graph: int = 20) -> list[dict]:
    """Microseconds per call of FlashInfer's decode kernel on CUDA cores and on tensor cores, in
    its CUDA-graph mode (each graph holds ``calls_per_graph`` calls), bf16, head_dim 128."""
    import functools

    import flashinfer

    from benchmarks.kernels import call, graph_us  # (here: --kernels-only-json runs this file on older trees)

    rows = []
    for model, (hq, hkv) in {"qwen3-0.6b": (16, 8), "llama-3.1-8b": (32, 8)}.items():
        for bs in batch_sizes:
            for ctx in contexts:
                pages = -(-ctx // page_size)
                k = torch.randn(bs * pages, page_size, hkv, 128, dtype=torch.bfloat16, device=device)
                v = torch.randn_like(k)
                indptr = torch.arange(bs + 1, dtype=torch.int32, device=device) * pages
                indices = torch.arange(bs * pages, dtype=torch.int32, device=device)
                last = torch.full((bs,), ctx - (pages - 1) * page_size, dtype=torch.int32, device=device)
                q = torch.randn(bs, hq, 128, dtype=torch.bfloat16, device=device)
                row: dict = {"model": model, "batch_size": bs, "context": ctx}
                for key, tc in (("cuda_cores_us", False), ("tensor_cores_us", True)):
                    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                        torch.empty(128 << 20, dtype=torch.uint8, device=device), "NHD", use_cuda_graph=True,
                        use_tensor_cores=tc, paged_kv_indptr_buffer=indptr.clone(),
                        paged_kv_indices_buffer=torch.empty_like(indices), paged_kv_last_page_len_buffer=last.clone())
                    wrapper.plan(indptr, indices, last, hq, hkv, 128, page_size, pos_encoding_mode="NONE",
                                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
                    row[key] = graph_us(functools.partial(call, wrapper.run, (q, (k, v))), calls_per_graph, replays)
                    del wrapper
                rows.append(row)
                print(f"  decode kernel {model} bs={bs} ctx={ctx}: CUDA cores {row['cuda_cores_us']:.1f} us, "
                      f"tensor cores {row['tensor_cores_us']:.1f} us")
                del k, v
    empty_cache(device)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("graphs", __doc__, out="benchmarks/results/graphs_<device>.json")
    parser.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b", help="comma-separated shapes (or tiny)")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--graph-max-bs", type=int, default=256, help="cuda_graph_max_bs of the 'on' runs")
    parser.add_argument("--yardstick-shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--yardstick-requests", type=int, default=256, help="0: skip")
    parser.add_argument("--yardstick-len", default="100,1024")
    parser.add_argument("--yardstick-repeats", type=int, default=3)
    parser.add_argument("--compare-kernels-with", default=None,
                        help="another checkout (e.g. lesson 7's) whose eager decode kernels are counted too")
    parser.add_argument("--attention-sweep", action="store_true",
                        help="also time both FlashInfer decode kernels over batch sizes and contexts (CUDA)")
    parser.add_argument("--timeline-processes", type=int, default=0,
                        help="CUDA: where a bs=1 step's time goes with graphs, in this many fresh processes (first shape)")
    parser.add_argument("--kernels-only-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timeline-only-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device
    cuda = device.startswith("cuda")
    dtype = benchmark_dtype(device, args.threads)
    if args.kernels_only_json:  # the child of --compare-kernels-with (runs on an older tree)
        counts = {}
        for shape in args.shapes.split(","):
            counts[shape] = kernels_per_decode_step(build(shape, device, dtype, None, max_running=8, max_seq_len=512))
            empty_cache(device)
        print(json.dumps(counts))
        return
    if args.timeline_only_json:  # a child of --timeline-processes
        shape = args.shapes.split(",")[0]
        llm = build(shape, device, dtype, args.graph_max_bs, max_running=8, max_seq_len=128 + args.decode_tokens + 64)
        vocab = llm.config.vocab_size
        print(json.dumps({"ms_per_token": decode_ms_per_token(llm, device, args.decode_tokens, vocab), **bs1_timeline(llm)}))
        return
    bandwidth = copy_bandwidth(device)
    results: dict = {"copy_bandwidth_bytes_s": bandwidth, "decode": {}}

    for shape in args.shapes.split(","):
        vocab = SHAPES[shape]["vocab_size"] if shape in SHAPES else 512
        entry: dict = {}
        for key, bs in (("graphs_off", 0), ("graphs_on", args.graph_max_bs)):
            t0 = time.perf_counter()
            llm = build(shape, device, dtype, bs, max_running=8, max_seq_len=128 + args.decode_tokens + 64)
            if bs:
                entry["startup_s_with_capture"] = time.perf_counter() - t0
                entry["graph_memory_bytes"] = llm.graph_memory_bytes
                entry["graph_memory_split"] = {"buffers_and_workspaces_bytes": llm.graph_memory.buffers,
                                               "captured_graphs_bytes": llm.graph_memory.graphs}
                entry["buckets"] = llm.engine.runner.buckets
            entry[key] = decode_ms_per_token(llm, device, args.decode_tokens, vocab)
            if cuda:
                entry[f"kernels_{key}"] = kernels_per_decode_step(llm)
            step_bytes = decode_bytes(llm, 128 + args.decode_tokens // 2)
            del llm
            empty_cache(device)
        entry["speedup"] = entry["graphs_off"] / entry["graphs_on"]
        add_roofline(entry, step_bytes, bandwidth, entry["graphs_on"])
        results["decode"][shape] = entry
        print(f"{shape}: bs=1 decode {entry['graphs_off']:.2f} ms/token eager, {entry['graphs_on']:.2f} with graphs "
              f"({entry['speedup']:.2f}x)" + (f"; roofline {entry['roofline_ms']:.2f} ms "
                                              f"({entry['fraction_of_roofline']:.0%})" if bandwidth else ""))
        if cuda:
            print(f"  kernels per step: eager {entry['kernels_graphs_off']['kernels_per_step']:.0f}, "
                  f"graphs {entry['kernels_graphs_on']['kernels_per_step']:.0f}; graph memory "
                  f"{entry['graph_memory_bytes'] / 2**20:.0f} MiB, start-up with capture {entry['startup_s_with_capture']:.1f} s")

    if args.compare_kernels_with and cuda:
        other = kernels_of_other_tree(args.compare_kernels_with, args.shapes.split(","), device)
        results["kernels_compared_tree"] = {"tree": args.compare_kernels_with, "eager": other}
        for shape, counts in other.items():
            print(f"{shape}: eager kernels per step at {args.compare_kernels_with}: {counts['kernels_per_step']:.0f}")

    if args.timeline_processes and cuda:
        shape = args.shapes.split(",")[0]
        print(f"{shape}: where a bs=1 step's time goes with graphs, {args.timeline_processes} processes")
        results["bs1_timeline"] = {"shape": shape, "host_wait_gap_us": HOST_WAIT_GAP_US,
                                   "processes": timeline_in_processes(shape, device, args.timeline_processes,
                                                                      args.decode_tokens)}

    if args.attention_sweep and cuda:
        results["decode_attention_kernels"] = decode_kernel_sweep(device)

    if args.yardstick_requests > 0:
        from benchmarks.offline import yardstick_side_by_side  # (not at the top: --kernels-only-json runs on older trees)

        results["yardstick"] = yardstick_side_by_side(
            args, device, dtype, {"graphs_off": {"cuda_graph_max_bs": 0}, "graphs_on": {"cuda_graph_max_bs": args.graph_max_bs}})

    config = {"shapes": args.shapes.split(","), "device": device, "dtype": str(dtype).replace("torch.", ""),
              "decode_prompt_len": 128, "decode_tokens": args.decode_tokens, "graph_max_bs": args.graph_max_bs,
              "yardstick_shape": args.yardstick_shape, "yardstick_requests": args.yardstick_requests,
              "yardstick_len": args.yardstick_len, "yardstick_repeats": args.yardstick_repeats, "ignore_eos": True,
              "compare_kernels_with": args.compare_kernels_with, "attention_sweep": args.attention_sweep,
              "timeline_processes": args.timeline_processes,
              "seed": args.seed, "overlap": True,
              "defaults": "LLM defaults otherwise (page_size 16, prefix cache on, chunked_prefill_size 8192)",
              "cpu_threads": torch.get_num_threads()}
    out = args.out or f"benchmarks/results/graphs_{'gpu' if cuda else 'cpu'}.json"
    print(f"wrote {write_result(out, 'graphs', config, results)}")


if __name__ == "__main__":
    main()
