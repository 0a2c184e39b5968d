"""Tensor-parallel benchmark (lesson 9): TP=2 against TP=1, in one run.

For one model shape (random weights of the real shape, bf16 on CUDA; overlap and the prefix
cache on, as everywhere):

* **bs=1 decode** ms/token (prefill left out, as in the overlap benchmark), TP=1 and TP=2, CUDA
  graphs off and on, against each one's HBM roofline: the bytes *one rank* reads per step
  (its half of the weights and of the KV) over the copy bandwidth measured in this run;
  TP=2 once more with every all-reduce through NCCL (``tp_all_reduce="nccl"``), and once with
  symmetric memory's all-reduce not fused with the residual add + RMSNorm after it
  (``tp_all_reduce="symmetric"``; the default fuses them);
* **the all-reduce TP adds**: microseconds per all-reduce of a ``[bs, hidden]`` activation
  between the ranks, eager and captured in a CUDA graph, over batch sizes: through
  ``torch.distributed`` (NCCL on GPUs, gloo on the CPU) and through symmetric memory (GPUs).
  A decode step makes ``2 * layers + 1`` of them and one all-gather of the logits;
* **the offline yardstick**: 256 requests of 100..1024 tokens, a TP=1 and a TP=2 engine alive
  side by side with the same KV pages, alternating over ``--yardstick-repeats`` workloads.

    python -m benchmarks tp                                    # two GPUs
    python -m benchmarks tp --shape tiny --device cpu --decode-tokens 32 \\
        --yardstick-requests 16 --yardstick-len 16,64             # CPU, gloo, two processes
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, empty_cache, sync, yardstick_side_by_side
from benchmarks.overlap import copy_bandwidth, decode_bytes, decode_ms_per_token
from minisgl.llm import LLM

ALL_REDUCE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192)


def time_all_reduce(all_reduce, x: torch.Tensor, calls: int = 200, graph: bool = False) -> float:
    """Wall-clock microseconds per in-place ``all_reduce(x)`` (every rank calls this together).
    ``graph``: ``calls`` all-reduces captured in one CUDA graph, replayed."""
    for _ in range(5):  # warm-up (the first NCCL call sets up the communicator)
        all_reduce(x)
    sync(str(x.device))
    if graph:
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            for _ in range(calls):
                all_reduce(x)
        cuda_graph.replay()
        sync(str(x.device))
        run = cuda_graph.replay
    else:
        def run() -> None:
            for _ in range(calls):
                all_reduce(x)
    replays = 5
    start = time.perf_counter()
    for _ in range(replays):
        run()
    sync(str(x.device))
    return (time.perf_counter() - start) / (replays * calls) * 1e6


def all_reduce_rank(settings: dict, rank: int, size: int):
    """A rank of the all-reduce timing (a worker for :class:`RankProcesses`): answers
    ``{"cmd": "all_reduce", "batch_sizes": [...]}`` with one row per batch size: microseconds
    through ``torch.distributed`` (``*_us``) and, where it applies, symmetric memory
    (``symmetric_*_us``)."""
    import torch.distributed as dist

    from minisgl.distributed.symmetric import SymmetricAllReduce, symmetric_all_reduce_available

    device, hidden = settings["device"], settings["hidden_size"]
    dtype = getattr(torch, settings["dtype"])
    cuda = device.startswith("cuda")
    symmetric = SymmetricAllReduce(device) if symmetric_all_reduce_available(device, size) else None

    def handle(command: dict) -> dict:
        rows = []
        for bs in command["batch_sizes"]:
            x = torch.zeros(bs, hidden, dtype=dtype, device=device)  # zeros: the sums stay finite
            row = {"batch_size": bs, "bytes": x.numel() * x.element_size(), "eager_us": time_all_reduce(dist.all_reduce, x)}
            if cuda:
                row["graph_us"] = time_all_reduce(dist.all_reduce, x, graph=True)
            if symmetric is not None and symmetric.fits(x):
                row["symmetric_eager_us"] = time_all_reduce(symmetric.all_reduce, x)
                row["symmetric_graph_us"] = time_all_reduce(symmetric.all_reduce, x, graph=True)
            rows.append(row)
        return {"rows": rows}

    return handle, {}


def inspect_steps(llm: LLM, command: dict) -> dict:
    """``{"cmd": "kernels"}``: the kernels of one bs=1 decode step, by kind; ``{"cmd": "trace",
    "batch": n}``: a timeline of decode steps of ``n`` requests (host phases and device)."""
    from benchmarks.graphs import kernels_per_decode_step
    from benchmarks.overlap import trace_steps

    if command["cmd"] == "kernels":
        return kernels_per_decode_step(llm)
    return {"steps": trace_steps(llm, llm.device, num_requests=command["batch"],
                                 prompt_len=command.get("prompt_len", 256), new_tokens=64)}


def inspect_rank(settings: dict, rank: int, size: int):
    """A rank that answers :func:`inspect_steps` commands (a worker for :class:`RankProcesses`)."""
    from minisgl.engine.builder import rank_engine
    from minisgl.llm import LLM

    llm = LLM.over(rank_engine(settings, rank, size))
    return (lambda command: inspect_steps(llm, command)), {}


def inspect(model_dir: Path, tp: int, commands: list[dict], **settings) -> list[dict]:
    """Run :func:`inspect_steps` commands on one engine (rank 0's answers, for tp > 1)."""
    from minisgl.distributed.launcher import RankProcesses

    if tp == 1:
        llm = LLM(model_dir, **settings)
        answers = [inspect_steps(llm, c) for c in commands]
        del llm
        return answers
    settings["dtype"] = str(settings["dtype"]).replace("torch.", "")
    # tp_size in the settings: without it every rank would build (and profile) a whole TP=1 model
    ranks = RankProcesses(tp, "benchmarks.tp:inspect_rank", {"model": str(model_dir), **settings, "tp_size": tp})
    try:
        return [ranks.call(c)[0] for c in commands]
    finally:
        ranks.close()


def step_summary(steps: list[dict]) -> dict:
    """Mean milliseconds per step of a :func:`trace_steps` timeline: period, device, host phases."""
    n = len(steps) - 1
    summary = {"period_ms": (steps[-1]["launch"][0] - steps[0]["launch"][0]) / n}
    for key in ("schedule", "launch", "process", "device"):
        if key in steps[0]:
            summary[f"{key}_ms"] = sum(s[key][1] - s[key][0] for s in steps[:n]) / n
    return summary


def measure_all_reduce(device: str, dtype: torch.dtype, hidden: int, tp_size: int,
                       batch_sizes=ALL_REDUCE_BATCH_SIZES) -> list[dict]:
    """All-reduce timings from ``tp_size`` rank processes (rank 0's clock; the ranks run in lock step)."""
    from minisgl.distributed.launcher import RankProcesses

    ranks = RankProcesses(tp_size, "benchmarks.tp:all_reduce_rank",
                          {"device": device, "dtype": str(dtype).replace("torch.", ""), "hidden_size": hidden})
    try:
        rows = ranks.call({"cmd": "all_reduce", "batch_sizes": list(batch_sizes)})[0]["rows"]
    finally:
        ranks.close()
    for row in rows:
        print(f"  all-reduce [{row['batch_size']}, {hidden}] ({row['bytes'] / 1024:.0f} KiB): "
              f"{row['eager_us']:.1f} us eager" + (f", {row['graph_us']:.1f} us in a graph" if "graph_us" in row else "")
              + (f"; symmetric memory {row['symmetric_eager_us']:.1f} us eager, {row['symmetric_graph_us']:.1f} us in a "
                 f"graph" if "symmetric_graph_us" in row else ""))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("tp", __doc__, threads=False, out="benchmarks/results/tp_<device>.json")
    parser.add_argument("--shape", default="llama-3.1-8b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--tp", type=int, default=2, help="the tensor-parallel size compared with TP=1")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--yardstick-requests", type=int, default=256, help="0: skip")
    parser.add_argument("--yardstick-len", default="100,1024")
    parser.add_argument("--yardstick-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the TP=1 engine on the CPU")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one bs=1 decode step's kernels (TP=1, TP=2, TP=2 through NCCL) and "
                             "trace decode steps of --trace-batch requests (host phases and device) (CUDA)")
    parser.add_argument("--trace-batch", type=int, default=128)
    args = parser.parse_args(argv)
    device, cuda = args.device, args.device.startswith("cuda")
    if cuda and torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs, this machine has {torch.cuda.device_count()}")
    dtype = benchmark_dtype(device, args.threads)
    model_dir, dummy, name = benchmark_checkpoint(args.shape)
    vocab = SHAPES[args.shape]["vocab_size"] if args.shape in SHAPES else 512
    bandwidth = copy_bandwidth(device)
    results: dict = {"copy_bandwidth_bytes_s": bandwidth, "decode": {}}

    context = 128 + args.decode_tokens // 2
    graph_settings = {"graphs_off": 0, "graphs_on": 256} if cuda else {"graphs_off": 0}
    runs = [(tp, key, graph_bs, "auto") for tp in (1, args.tp) for key, graph_bs in graph_settings.items()]
    if cuda:
        runs.append((args.tp, "graphs_on_symmetric", 256, "symmetric"))  # the all-reduce and the norm apart
        runs.append((args.tp, "graphs_on_nccl", 256, "nccl"))  # every all-reduce through NCCL
    for tp, key, graph_bs, all_reduce in runs:
        llm = LLM(Path(model_dir), device=device, dtype=dtype, dummy_weights=dummy, tp_size=tp, max_running=8,
                  max_seq_len=128 + args.decode_tokens + 64, cuda_graph_max_bs=graph_bs, tp_all_reduce=all_reduce)
        ms = decode_ms_per_token(llm, device, args.decode_tokens, vocab)
        if tp == 1:
            step_bytes = decode_bytes(llm, context)  # one rank reads 1/tp of it (norms aside: < 0.01%)
            layers, hidden = llm.config.num_layers, llm.config.hidden_size
        llm.close()
        del llm
        empty_cache(device)
        entry = results["decode"].setdefault(f"tp{tp}", {"bytes_per_rank_per_step": step_bytes // tp})
        entry[key] = ms
        print(f"TP={tp} {key}: bs=1 decode {ms:.2f} ms/token")
    best = list(graph_settings)[-1]  # graphs on where there are graphs
    for tp in (1, args.tp):
        entry = results["decode"][f"tp{tp}"]
        if bandwidth:
            entry["roofline_ms"] = entry["bytes_per_rank_per_step"] / bandwidth * 1e3
            entry["fraction_of_roofline"] = entry["roofline_ms"] / entry[best]
    results["decode_speedup"] = results["decode"]["tp1"][best] / results["decode"][f"tp{args.tp}"][best]
    print(f"bs=1 decode, {best}: TP={args.tp} is {results['decode_speedup']:.2f}x TP=1")

    if args.profile and cuda:
        results["kernels_per_decode_step"] = {}
        results["decode_trace"] = {"batch": args.trace_batch}
        for key, tp, all_reduce in (("tp1", 1, "auto"), (f"tp{args.tp}", args.tp, "auto"),
                                    (f"tp{args.tp}_nccl", args.tp, "nccl")):
            profile, trace = inspect(Path(model_dir), tp, [{"cmd": "kernels"}, {"cmd": "trace", "batch": args.trace_batch}],
                                     device=device, dtype=dtype, dummy_weights=dummy, tp_all_reduce=all_reduce,
                                     max_running=max(8, args.trace_batch), max_seq_len=512)
            results["kernels_per_decode_step"][key] = profile
            results["decode_trace"][key] = {"summary": step_summary(trace["steps"]), "steps": trace["steps"]}
            empty_cache(device)
            print(f"{key}: decode steps of {args.trace_batch}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in results["decode_trace"][key]["summary"].items()))
            device_ms = sum(k["us_per_step"] for k in profile["by_kind"].values()) / 1e3
            print(f"{key}: {profile['kernels_per_step']:.0f} kernels, {device_ms:.2f} ms of device time per step; "
                  + ", ".join(f"{kind} {v['us_per_step']:.0f} us" for kind, v in list(profile["by_kind"].items())[:4]))

    results["collectives_per_decode_step"] = {"all_reduce": 2 * layers + 1, "all_gather": 1}
    results["all_reduce"] = measure_all_reduce(device, dtype, hidden, args.tp)

    if args.yardstick_requests > 0:
        args.yardstick_shape = args.shape
        sides = {"tp1": {"tp_size": 1}, f"tp{args.tp}": {"tp_size": args.tp}}
        results["yardstick"] = yardstick_side_by_side(args, device, dtype, sides)

    config = {"shape": name, "tp": args.tp, "device": device, "dtype": str(dtype).replace("torch.", ""),
              "decode_prompt_len": 128, "decode_tokens": args.decode_tokens,
              "graph_max_bs": graph_settings.get("graphs_on", 0), "yardstick_requests": args.yardstick_requests,
              "yardstick_len": args.yardstick_len, "yardstick_repeats": args.yardstick_repeats, "ignore_eos": True,
              "seed": args.seed, "overlap": True, "profile": args.profile, "trace_batch": args.trace_batch,
              "comm_backend": "nccl" if cuda else "gloo",
              "defaults": "LLM defaults otherwise (page_size 16, prefix cache on, chunked_prefill_size 8192)",
              "cpu_threads_tp1": torch.get_num_threads()}
    out = args.out or f"benchmarks/results/tp_{'gpu' if cuda else 'cpu'}.json"
    print(f"wrote {write_result(out, 'tp', config, results)}")


if __name__ == "__main__":
    main()
