"""Overlap-scheduling benchmark: overlap on and off in one run.

Two measurements per model shape (random weights of the real shape, bf16 on CUDA):

* **bs=1 decode**: one request, a 128-token prompt, ``--decode-tokens`` new tokens
  (``ignore_eos``). ms/token = (time for N tokens - time for 1 token) / (N - 1), so the prefill
  is left out. Compared with the HBM roofline: the bytes one decode step must read (every
  weight once, plus the request's KV) over the copy bandwidth measured in the same run.
* **the offline yardstick** (Qwen3-0.6B shape only by default): 256 requests, lengths uniform
  in 100..1024, as in ``python -m benchmarks offline``, engine only; ``--yardstick-repeats``
  workloads, each run by both engines in turn (see ``offline.yardstick_side_by_side``).
* **a timeline** of ten decode steps (256 requests of 1024 prompt tokens, all decoding): when
  the host scheduled, launched and processed each step and when the device ran it, overlap off
  and on.

    python -m benchmarks overlap                                     # GPU
    python -m benchmarks overlap --shapes tiny --yardstick-requests 32 --yardstick-len 16,64 \\
        --decode-tokens 64 --timeline-requests 16 --timeline-prompt-len 64 \
        --timeline-first-step 4                                          # CPU, tiny model
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, empty_cache, sync, yardstick_side_by_side
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float | None:
    """Device memory bandwidth in bytes/s from a large copy (read + write), or None on the CPU."""
    if not device.startswith("cuda"):
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    reps = 20
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    return 2 * nbytes * reps / (time.perf_counter() - start)


def decode_ms_per_token(llm: LLM, device: str, tokens: int, vocab: int) -> float:
    """bs=1 decode time per token, prefill excluded (see the module docstring)."""
    prompt = [(7 * i + 3) % vocab for i in range(128)]

    def timed(n: int, shift: int) -> float:
        p = [(t + shift) % vocab for t in prompt]  # a fresh prompt: no prefix-cache hit
        sync(device)
        start = time.perf_counter()
        llm.generate([p], SamplingParams(max_tokens=n, ignore_eos=True), progress=False)
        sync(device)
        return time.perf_counter() - start

    timed(8, 1)  # warm-up
    one = min(timed(1, 2 + i) for i in range(3))
    many = min(timed(tokens, 10 + i) for i in range(3))
    return (many - one) / (tokens - 1) * 1e3


def decode_bytes(llm: LLM, context: int) -> int:
    """Bytes one bs=1 decode step must read: every weight once, and ``context`` tokens of KV."""
    weights = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    return weights + context * llm.config.kv_bytes_per_token(llm.dtype)


def add_roofline(entry: dict, step_bytes: int, bandwidth: float | None, measured_ms: float) -> None:
    """Put ``bytes_per_step`` in ``entry`` and, with a measured bandwidth (GPU), ``roofline_ms``
    (those bytes over it) and ``fraction_of_roofline`` (roofline / ``measured_ms``)."""
    entry["bytes_per_step"] = step_bytes
    if bandwidth:
        entry["roofline_ms"] = step_bytes / bandwidth * 1e3
        entry["fraction_of_roofline"] = entry["roofline_ms"] / measured_ms


def trace_steps(llm: LLM, device: str, num_requests: int = 32, prompt_len: int = 256, new_tokens: int = 64,
                first: int = 20, count: int = 12) -> list[dict]:
    """A timeline of ``count`` steps (from step ``first``) of a decode-heavy batch: for each step,
    when the host scheduled, launched and processed, and when the device ran it (CUDA events
    at the start and the end of the launched work), in ms from the first traced step.

    The real methods are wrapped, not changed: ``Scheduler.schedule``; with overlap,
    ``OverlapEngine.launch`` and ``OverlapLoop._complete`` (which waits for a batch's tokens and
    processes them); without, lesson 4's ``Engine.step`` (which runs the batch and waits for its
    tokens: the wait is in "launch") and ``Scheduler.process``."""
    sched, engine = llm.scheduler, llm.engine
    run_batch = (engine, "launch") if hasattr(engine, "launch") else (engine, "step")
    complete = (sched.loop, "_complete") if hasattr(sched.loop, "_complete") else (sched, "process")
    cuda = device.startswith("cuda")
    host: dict[str, list[tuple[float, float]]] = {"schedule": [], "launch": [], "process": []}
    gpu: list[tuple] = []

    def wrap(obj, name: str, key: str, on_device: bool = False) -> None:
        real = getattr(obj, name)

        def timed(*args):
            start_event = torch.cuda.Event(enable_timing=True) if on_device and cuda else None
            if start_event is not None:
                start_event.record()
            t0 = time.perf_counter()
            out = real(*args)
            host[key].append((t0, time.perf_counter()))
            if start_event is not None:
                end_event = torch.cuda.Event(enable_timing=True)
                end_event.record()
                gpu.append((start_event, end_event))
            return out

        setattr(obj, name, timed)

    wrap(sched, "schedule", "schedule")
    wrap(*run_batch, "launch", on_device=True)
    wrap(*complete, "process")
    vocab = llm.config.vocab_size
    prompts = [[(31 * i + 7 * j) % vocab for j in range(prompt_len)] for i in range(num_requests)]
    sync(device)
    reference = torch.cuda.Event(enable_timing=True) if cuda else None
    if reference is not None:
        reference.record()
    t_ref = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True), progress=False)
    sync(device)
    for obj, name in ((sched, "schedule"), run_batch, complete):
        delattr(obj, name)  # back to the class's methods
    steps = []
    base = None
    for i in range(first, min(first + count, len(host["launch"]))):
        row = {key: [(a - t_ref) * 1e3, (b - t_ref) * 1e3] for key, (a, b) in
               ((k, host[k][i]) for k in host if i < len(host[k]))}
        if cuda:
            start_event, end_event = gpu[i]
            row["device"] = [reference.elapsed_time(start_event), reference.elapsed_time(end_event)]
        base = row["schedule"][0] if base is None else base
        steps.append({k: [v[0] - base, v[1] - base] for k, v in row.items()})
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("overlap", __doc__, out="benchmarks/results/overlap_<device>.json")
    parser.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b", help="comma-separated shapes (or tiny)")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--yardstick-shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--yardstick-requests", type=int, default=256, help="0: skip")
    parser.add_argument("--yardstick-len", default="100,1024")
    parser.add_argument("--yardstick-repeats", type=int, default=3)
    parser.add_argument("--timeline-requests", type=int, default=256)
    parser.add_argument("--timeline-prompt-len", type=int, default=1024)
    parser.add_argument("--timeline-first-step", type=int, default=40,
                        help="first traced step (after the prompts are in: 256 x 1024 tokens take 32 chunks)")
    args = parser.parse_args(argv)
    device = args.device
    dtype = benchmark_dtype(device, args.threads)
    bandwidth = copy_bandwidth(device)
    results: dict = {"copy_bandwidth_bytes_s": bandwidth, "decode": {}}

    def build(shape: str, overlap: bool, **kw) -> LLM:
        model_dir, dummy, _ = benchmark_checkpoint(shape)
        return LLM(Path(model_dir), device=device, dtype=dtype, dummy_weights=dummy, overlap=overlap, **kw)

    for shape in args.shapes.split(","):
        vocab = SHAPES[shape]["vocab_size"] if shape in SHAPES else 512
        entry: dict = {}
        for key, overlap in (("overlap_off", False), ("overlap_on", True)):
            llm = build(shape, overlap, max_running=8, max_seq_len=128 + args.decode_tokens + 8)
            entry[key] = decode_ms_per_token(llm, device, args.decode_tokens, vocab)
            step_bytes = decode_bytes(llm, 128 + args.decode_tokens // 2)
            del llm
            empty_cache(device)
        entry["speedup"] = entry["overlap_off"] / entry["overlap_on"]
        add_roofline(entry, step_bytes, bandwidth, entry["overlap_on"])
        results["decode"][shape] = entry
        print(f"{shape}: bs=1 decode {entry['overlap_off']:.2f} ms/token without overlap, "
              f"{entry['overlap_on']:.2f} with ({entry['speedup']:.2f}x)"
              + (f"; roofline {entry['roofline_ms']:.2f} ms" if bandwidth else ""))

    timeline = {}
    for key, overlap in (("overlap_off", False), ("overlap_on", True)):
        model_dir, dummy, _ = benchmark_checkpoint(args.yardstick_shape)
        llm = LLM(Path(model_dir), device=device, dtype=dtype, dummy_weights=dummy, overlap=overlap)
        trace_steps(llm, device, first=0, count=1)  # warm-up
        timeline[key] = trace_steps(llm, device, num_requests=args.timeline_requests, prompt_len=args.timeline_prompt_len,
                                    new_tokens=args.timeline_first_step + 24, first=args.timeline_first_step, count=10)
        del llm
        empty_cache(device)
    results["timeline"] = {"shape": args.yardstick_shape, "requests": args.timeline_requests,
                           "prompt_len": args.timeline_prompt_len, "first_step": args.timeline_first_step,
                           "steps": timeline}
    print("timeline: " + ", ".join(f"{k} {v[-1]['process'][1] / len(v):.2f} ms/step" for k, v in timeline.items()))

    if args.yardstick_requests > 0:
        results["yardstick"] = yardstick_side_by_side(
            args, device, dtype, {"overlap_off": {"overlap": False}, "overlap_on": {"overlap": True}})

    config = {"shapes": args.shapes.split(","), "device": device, "dtype": str(dtype).replace("torch.", ""),
              "decode_prompt_len": 128, "decode_tokens": args.decode_tokens,
              "yardstick_shape": args.yardstick_shape, "yardstick_requests": args.yardstick_requests,
              "yardstick_len": args.yardstick_len, "yardstick_repeats": args.yardstick_repeats, "ignore_eos": True,
              "seed": args.seed,
              "defaults": "LLM defaults otherwise (page_size 16, prefix cache on, chunked_prefill_size 8192)",
              "cpu_threads": torch.get_num_threads()}
    out = args.out or f"benchmarks/results/overlap_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'overlap', config, results)}")


if __name__ == "__main__":
    main()
