"""Radix-cache benchmark: a shared-prefix workload with the prefix cache on and off, in one run.

The default workload (GPU): 256 requests in 16 groups; the requests of a group share a
2,048-token system prompt and each adds its own 128-token question; 256 output tokens each,
``ignore_eos``; the Qwen3-0.6B shape with random weights (speed does not depend on weight
values). The requests arrive all at once, groups interleaved. With the cache on, a group's
system prompt is prefilled once and then read from the tree; with it off, 256 times.

    python -m benchmarks radix                                  # GPU
    python -m benchmarks radix --shape tiny --groups 4 --per-group 8 \\
        --system-len 96 --question-len 8 --output-len 16           # CPU, tiny model

The JSON reports, for each setting, the time, output and total tok/s, and the prompt tokens
served from the cache; and the ratio of the two throughputs.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, empty_cache, sync
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams


def shared_prefix_workload(groups: int, per_group: int, system_len: int, question_len: int,
                           vocab: int, seed: int) -> list[list[int]]:
    """``groups * per_group`` prompts of ``system_len + question_len`` random ids; the prompts of
    one group share their first ``system_len`` ids. Shuffled, so the groups interleave."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(system_len)] for _ in range(groups)]
    prompts = [s + [rng.randrange(vocab) for _ in range(question_len)] for s in systems for _ in range(per_group)]
    rng.shuffle(prompts)
    return prompts


def run_engine(model_dir: Path, dummy: bool, device: str, dtype: torch.dtype, prefix_cache: bool,
               prompts: list[list[int]], output_len: int, page_size: int, max_running: int) -> dict:
    llm = LLM(model_dir, device=device, dtype=dtype, dummy_weights=dummy, page_size=page_size,
              max_running=max_running, prefix_cache=prefix_cache)
    warm = [[(t + 1) % llm.config.vocab_size for t in prompts[0][:64]]]  # shares no prefix with the run
    llm.generate(warm, SamplingParams(max_tokens=4, ignore_eos=True), progress=False)
    sync(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=output_len, ignore_eos=True))
    sync(device)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == output_len * len(prompts), "ignore_eos requests produce exactly max_tokens each"
    prompt_tokens = sum(map(len, prompts))
    cached = sum(o.num_cached_tokens for o in outs)
    stats = llm.scheduler.kv.stats
    result = {"prefix_cache": prefix_cache, "time_s": elapsed, "output_tokens": produced,
              "output_tok_s": produced / elapsed, "total_tok_s": (produced + prompt_tokens) / elapsed,
              "prompt_tokens": prompt_tokens, "cached_prompt_tokens": cached, "hit_rate": cached / prompt_tokens,
              "evicted_pages": stats.evicted_pages, "retractions": stats.retractions,
              "kv_pages": llm.pool.num_pages}
    print(f"prefix cache {'on ' if prefix_cache else 'off'}: {elapsed:.2f} s, {result['output_tok_s']:.0f} out tok/s, "
          f"{cached}/{prompt_tokens} prompt tokens from the cache")
    del llm, outs
    empty_cache(device)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("radix", __doc__, out="benchmarks/results/radix_<shape>_<device>.json")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--per-group", type=int, default=16)
    parser.add_argument("--system-len", type=int, default=2048)
    parser.add_argument("--question-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-running", type=int, default=256)
    args = parser.parse_args(argv)

    model_dir, dummy, name = benchmark_checkpoint(args.shape)
    device = args.device
    dtype = benchmark_dtype(device, args.threads)
    vocab = SHAPES[args.shape]["vocab_size"] if args.shape in SHAPES else 512
    prompts = shared_prefix_workload(args.groups, args.per_group, args.system_len, args.question_len, vocab, args.seed)

    runs = {key: run_engine(Path(model_dir), dummy, device, dtype, on, prompts, args.output_len, args.page_size,
                            args.max_running)
            for key, on in (("cache_off", False), ("cache_on", True))}
    results = {**runs, "speedup": runs["cache_on"]["output_tok_s"] / runs["cache_off"]["output_tok_s"]}
    print(f"radix cache on vs off: {results['speedup']:.2f}x output throughput")
    config = {"model": name, "dummy_weights": dummy, "device": device, "dtype": str(dtype).replace("torch.", ""),
              "groups": args.groups, "per_group": args.per_group, "system_len": args.system_len,
              "question_len": args.question_len, "output_len": args.output_len, "ignore_eos": True,
              "page_size": args.page_size, "max_running": args.max_running, "seed": args.seed,
              "cpu_threads": torch.get_num_threads()}
    out = args.out or f"benchmarks/results/radix_{name}_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'radix', config, results)}")


if __name__ == "__main__":
    main()
