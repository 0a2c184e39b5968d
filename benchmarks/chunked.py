"""Chunked-prefill benchmark: short requests behind one long prompt, chunking off and on, in one run.

The workload (GPU default): one 32,768-token prompt arrives at t = 0; then 64 short requests
(128-token prompts) arrive one by one, evenly spaced over the time the long prompt takes to
prefill in one piece (measured first, in the same run, so the short requests arrive while it
runs). Every request generates 32 tokens (``ignore_eos``). Qwen3-0.6B shape, random weights.

The same arrivals are served with whole prompts (``chunked_prefill_size=None``) and with each
chunk size of ``--chunk-sizes``. A request's time to first token (TTFT) runs from its scheduled
arrival to the end of the step that samples its first token: a request that arrives during a
step waits for that step, exactly as it would in a server. Each setting runs the scenario once to warm up and then
``--repeats`` times (fresh token ids each time, same lengths and arrival times). The JSON
reports, per setting, the short requests' TTFT over all repeats (mean, p50, p90, p99, max, and
every value, in arrival order per repeat), the long request's TTFT (median of the repeats) and
the ratio of p99 TTFTs against whole prompts.

Then the offline yardstick (the ``offline`` benchmark's workload, engine only) runs with whole
prompts and with each chunk size: what the shorter waits cost in throughput.

    python -m benchmarks chunked                                   # GPU
    python -m benchmarks chunked --shape tiny --long-len 1536 --short-len 16 --num-short 16 \\
        --chunk-sizes 256,64 --yardstick-requests 32 --yardstick-len 16,64   # CPU, tiny model
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, empty_cache, make_workload, run_yardstick, sync
from minisgl.core import Req
from minisgl.engine.config import EngineConfig
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams

DEFAULT_CHUNK = EngineConfig.__dataclass_fields__["chunked_prefill_size"].default  # one source of truth


@dataclass(frozen=True)
class Arrival:
    """A request that shows up ``at_s`` seconds after the run starts."""

    at_s: float
    prompt: list[int]
    max_tokens: int


def serve(llm: LLM, arrivals: list[Arrival], device: str) -> list[float]:
    """Drive ``llm``'s scheduler step by step, adding each request when its time comes; return
    each request's TTFT in seconds (from its scheduled arrival to the end of the step that
    sampled its first token). ``arrivals`` is sorted by time."""
    sched = llm.scheduler
    reqs: list[Req] = []
    ttft: dict[int, float] = {}
    waiting_first: set[int] = set()  # indices of requests without a first token yet
    start = time.perf_counter()
    while True:
        now = time.perf_counter() - start
        while len(reqs) < len(arrivals) and arrivals[len(reqs)].at_s <= now:
            a = arrivals[len(reqs)]
            waiting_first.add(len(reqs))
            reqs.append(sched.add_request(a.prompt, SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)))
        if not sched.has_work:
            if len(reqs) == len(arrivals):
                break
            time.sleep(max(0.0, arrivals[len(reqs)].at_s - (time.perf_counter() - start)))
            continue
        for req in sched.step():
            if req.finish_reason == "error":
                raise RuntimeError(f"request {req.rid} failed: {req.error}")
        sync(device)  # the step already waited for its tokens; this makes the clock honest anyway
        done = time.perf_counter() - start
        for i in [i for i in waiting_first if reqs[i].output_ids]:
            ttft[i] = done - arrivals[i].at_s
            waiting_first.discard(i)
    return [ttft[i] for i in range(len(arrivals))]


def summary(values: list[float]) -> dict[str, float]:
    """Mean and percentiles (inclusive method: p100 is the maximum) of ``values``."""
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return {"mean": statistics.fmean(values), "p50": cuts[49], "p90": cuts[89], "p99": cuts[98], "max": max(values)}


def make_llm(model_dir: Path, dummy: bool, device: str, dtype: torch.dtype, chunk: int | None, args) -> LLM:
    return LLM(model_dir, device=device, dtype=dtype, dummy_weights=dummy, page_size=args.page_size,
               max_running=args.max_running, max_seq_len=args.long_len + args.output_len,
               chunked_prefill_size=chunk)


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("chunked", __doc__, out="benchmarks/results/chunked_<shape>_<device>.json")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--long-len", type=int, default=32768)
    parser.add_argument("--short-len", type=int, default=128)
    parser.add_argument("--num-short", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per setting (after one warm-up run)")
    parser.add_argument("--chunk-sizes", default=f"{DEFAULT_CHUNK},4096,2048",
                        help="comma-separated chunk sizes to compare with whole prompts")
    parser.add_argument("--yardstick-requests", type=int, default=256, help="offline yardstick requests (0: skip)")
    parser.add_argument("--yardstick-len", default="100,1024", help="offline yardstick length range lo,hi")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-running", type=int, default=256)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.chunk_sizes.split(",")]
    lo, hi = (int(x) for x in args.yardstick_len.split(","))

    model_dir, dummy, name = benchmark_checkpoint(args.shape)
    model_dir = Path(model_dir)
    device = args.device
    dtype = benchmark_dtype(device, args.threads)
    vocab = SHAPES[args.shape]["vocab_size"] if args.shape in SHAPES else 512
    rng = random.Random(args.seed)

    def fresh_prompt(n: int) -> list[int]:  # random ids: nothing is shared, so the prefix cache never hits
        return [rng.randrange(vocab) for _ in range(n)]

    # 1. How long does the long prompt take to prefill in one piece? (warm-up first)
    llm = make_llm(model_dir, dummy, device, dtype, None, args)
    whole = []
    for _ in range(3):
        whole.append(serve(llm, [Arrival(0.0, fresh_prompt(args.long_len), 1)], device)[0])
    prefill_s = min(whole[1:])
    print(f"one {args.long_len}-token prefill, whole: {prefill_s * 1e3:.1f} ms (warm-up {whole[0] * 1e3:.1f} ms)")
    del llm
    empty_cache(device)

    # 2. The same arrivals for every setting (fresh token ids each time, same lengths and times).
    gap = prefill_s / args.num_short
    times = [0.0] + [gap * (i + 0.5) for i in range(args.num_short)]
    settings: dict[str, dict] = {}
    lens = [args.long_len] + [args.short_len] * args.num_short
    for chunk in [None, *sizes]:
        key = "whole" if chunk is None else f"chunk_{chunk}"
        llm = make_llm(model_dir, dummy, device, dtype, chunk, args)
        short_ttfts, long_ttfts = [], []
        for rep in range(args.repeats + 1):  # the first is a warm-up with every shape of the real run
            ttft = serve(llm, [Arrival(t, fresh_prompt(n), args.output_len) for t, n in zip(times, lens)], device)
            if rep > 0:
                long_ttfts.append(ttft[0])
                short_ttfts.extend(ttft[1:])
        short = summary(short_ttfts)
        settings[key] = {"chunked_prefill_size": chunk, "long_ttft_s": statistics.median(long_ttfts),
                         "long_ttfts_s": long_ttfts, "short_ttft_s": short, "short_ttfts_s": short_ttfts}
        print(f"{key:>11}: short-request TTFT p50 {short['p50'] * 1e3:7.1f} ms, p99 {short['p99'] * 1e3:7.1f} ms; "
              f"long request TTFT {settings[key]['long_ttft_s'] * 1e3:.1f} ms")
        del llm
        empty_cache(device)
    for _key, run in settings.items():
        run["p99_ratio_vs_whole"] = settings["whole"]["short_ttft_s"]["p99"] / run["short_ttft_s"]["p99"]
    results: dict = {"whole_prefill_s": prefill_s, "arrivals_s": times[1:], "settings": settings}
    for key, run in settings.items():
        if key != "whole":
            print(f"{key}: p99 TTFT of the short requests {run['p99_ratio_vs_whole']:.1f}x better than whole prompts")

    # 3. The offline yardstick, whole prompts and each chunk size: what does chunking cost?
    if args.yardstick_requests > 0:
        prompts, out_lens = make_workload(args.yardstick_requests, lo, hi, vocab, args.seed)
        yard: dict = {}
        for chunk in [None, *sizes]:
            key = "whole" if chunk is None else f"chunk_{chunk}"
            llm = LLM(model_dir, device=device, dtype=dtype, dummy_weights=dummy, page_size=args.page_size,
                      max_running=args.max_running, chunked_prefill_size=chunk)
            yard[key] = run_yardstick(llm, prompts, out_lens, device)
            yard[key]["vs_whole"] = yard[key]["output_tok_s"] / yard["whole"]["output_tok_s"]
            print(f"offline yardstick, {key}: {yard[key]['vs_whole']:.3f}x the throughput of whole prompts")
            del llm
            empty_cache(device)
        results["yardstick"] = yard

    config = {"model": name, "dummy_weights": dummy, "device": device, "dtype": str(dtype).replace("torch.", ""),
              "long_len": args.long_len, "short_len": args.short_len, "num_short": args.num_short,
              "output_len": args.output_len, "repeats": args.repeats, "chunk_sizes": sizes, "default_chunk": DEFAULT_CHUNK,
              "arrivals": "long prompt at 0, short ones evenly spaced over one whole-prompt prefill",
              "yardstick_requests": args.yardstick_requests, "yardstick_len": [lo, hi], "ignore_eos": True,
              "page_size": args.page_size, "max_running": args.max_running, "prefix_cache": True,
              "seed": args.seed, "cpu_threads": torch.get_num_threads()}
    out = args.out or f"benchmarks/results/chunked_{name}_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'chunked', config, results)}")


if __name__ == "__main__":
    main()
