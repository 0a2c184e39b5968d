"""Offline throughput benchmark: the engine against Hugging Face `generate`, in one run.

The yardstick workload (nano-vllm / mini-sglang style): 256 requests, input and output lengths
uniform in 100..1024, random token ids, ``ignore_eos``, Qwen3-0.6B shape with random weights
(speed does not depend on weight values). On a CPU, scale it down:

    python -m benchmarks offline                                   # GPU yardstick
    python -m benchmarks offline --shape tiny --num-requests 64 \\
        --min-len 16 --max-len 64 --hf-requests 64                    # CPU, tiny model

Two Hugging Face baselines run in the same process, on requests of the same workload, greedy
and never stopping early (the ``ignore_eos`` setting), each checked to produce exactly the
requested number of tokens:

* one at a time: the first ``--hf-requests`` requests, batch size 1, the way a naive server
  would (JSON ``results.hf``, ratio ``results.speedup_vs_hf``);
* batched: the first ``--hf-batched-requests`` requests (default: all of them) in static batches
  of ``--hf-batch-size`` (64), in workload order, prompts left-padded with an attention mask.
  A static batch decodes until its longest requested output; the extra tokens its shorter
  requests generate meanwhile are waste, so only the tokens each request asked for are counted
  (JSON ``results.hf_batched``, ratio ``results.speedup_vs_hf_batched``).

On an H200 (bf16, transformers 5.17) one batch of 64 yardstick requests takes about 43 s on the
Qwen3-0.6B shape and 82 s on the Llama-3.1-8B shape, so the batched baseline over all 256
requests (4 batches, plus one untimed warm-up batch) adds about 4 and 7 minutes.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser, write_result
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams

# HF config.json contents of real models, for random-weight benchmark checkpoints.
SHAPES: dict[str, dict] = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "eos_token_id": 151645,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "eos_token_id": [128001, 128008, 128009],
    },
    "qwen3-30b-a3b": {  # lesson 11: a mixture of experts (~61 GB in bf16; ~3.3B parameters active per token)
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "eos_token_id": 151645,
    },
}


def shape_checkpoint(shape: str, config: dict | None = None) -> Path:
    """A directory with the real model's config.json (``config``, default ``SHAPES[shape]``; no
    weights: load with dummy_weights) and the tiny test checkpoint's tokenizer (the benchmark feeds
    token ids). Only the tokenizer is built, not the tiny model: that took seconds in every
    benchmark process."""
    from minisgl.testing import tiny_tokenizer

    tiny = tiny_tokenizer("qwen3")
    out = Path(tempfile.mkdtemp(prefix=f"minisgl-{shape}-"))
    (out / "config.json").write_text(json.dumps(config or SHAPES[shape]))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((tiny / name).read_bytes())
    return out


def benchmark_checkpoint(shape: str) -> tuple[Path, bool, str]:
    """``(checkpoint dir, dummy_weights, name)`` for a ``SHAPES`` entry (real shape, random
    weights) or ``"tiny"`` (the tiny Qwen3 test checkpoint)."""
    if shape == "tiny":
        from minisgl.testing import tiny_checkpoint

        return tiny_checkpoint("qwen3"), False, "tiny-qwen3"
    return shape_checkpoint(shape), True, shape


def benchmark_dtype(device: str, cpu_threads: int) -> torch.dtype:
    """bf16 on CUDA; float32 with ``cpu_threads`` torch threads on the CPU."""
    if device.startswith("cuda"):
        return torch.bfloat16
    torch.set_num_threads(cpu_threads)
    return torch.float32


def chunk_size(text: str) -> int | None | str:
    """argparse type for a chunked-prefill size: a positive integer, ``none`` or ``default``."""
    if text in ("none", "default"):
        return None if text == "none" else text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'none' or 'default', got {text!r}")
    return int(text)


def make_workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """``n`` random prompts and output lengths, uniform in ``lo..hi``. The lengths depend only on
    the seed (not on the vocabulary), so every model shape gets the same amount of work."""
    lengths = random.Random(seed)
    in_lens = [lengths.randint(lo, hi) for _ in range(n)]
    out_lens = [lengths.randint(lo, hi) for _ in range(n)]
    ids = random.Random(seed + 1)
    prompts = [[ids.randrange(vocab) for _ in range(m)] for m in in_lens]
    return prompts, out_lens


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def empty_cache(device: str) -> None:
    """Hand cached GPU memory back between runs (the next engine sizes its KV pool from what is free).

    An engine is a web of objects with reference cycles: collect them first, or the memory of
    an engine already deleted stays allocated and the next one gets a smaller KV pool."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def load_hf(model_dir: Path, dummy: bool, dtype: torch.dtype, device: str):
    """The HF model for the baselines, its EOS ids cleared (so that nothing stops early)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if dummy:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    model.eval()
    # `generate` fills unset fields from the model's generation config, EOS ids included.
    model.generation_config.eos_token_id = None
    return model


@torch.inference_mode()
def hf_generate_batch(model, prompts: list[list[int]], out_lens: list[int], device: str,
                      pad_token_id: int = 0) -> list[list[int]]:
    """One static batch through HF `generate`: greedy, no early stop, prompts left-padded.

    The batch decodes ``max(out_lens)`` tokens for every row; each request's result is cut to
    the length it asked for. A batch of one is the plain one-at-a-time call (no padding).
    """
    from transformers import GenerationConfig

    width, steps = max(map(len, prompts)), max(out_lens)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    cfg = GenerationConfig(do_sample=False, max_new_tokens=steps, min_new_tokens=steps,
                           eos_token_id=None, pad_token_id=pad_token_id)
    out = model.generate(ids.to(device), attention_mask=mask.to(device), generation_config=cfg)
    if out.shape != (len(prompts), width + steps):
        raise RuntimeError(f"HF generate returned shape {tuple(out.shape)}, expected {(len(prompts), width + steps)}")
    new = out[:, width:].tolist()
    return [row[:n] for row, n in zip(new, out_lens)]


def _timed(device: str, fn) -> tuple[object, float]:
    sync(device)
    start = time.perf_counter()
    value = fn()
    sync(device)
    return value, time.perf_counter() - start


def _count(outs: list[list[int]], out_lens: list[int], what: str) -> int:
    got = [len(o) for o in outs]
    if got != list(out_lens):
        raise RuntimeError(f"{what}: produced {got} tokens per request, asked for {list(out_lens)}")
    return sum(got)


def run_yardstick(llm: LLM, prompts: list[list[int]], out_lens: list[int], device: str) -> dict:
    """Time ``llm.generate`` on the workload (after a short warm-up that shares no prefix with it)
    and return its numbers; checks that every request produced exactly what it asked for."""
    warm = [p[::-1] for p in prompts[:2]]
    llm.generate(warm, [SamplingParams(max_tokens=8, ignore_eos=True)] * len(warm), progress=False)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in out_lens]
    outs, elapsed = _timed(device, lambda: llm.generate(prompts, params))
    produced = _count([o.token_ids for o in outs], out_lens, "minisgl")
    print(f"minisgl: {produced} tokens in {elapsed:.2f} s = {produced / elapsed:.1f} out tok/s")
    return {"requests": len(prompts), "input_tokens": sum(map(len, prompts)), "output_tokens": produced,
            "time_s": elapsed, "output_tok_s": produced / elapsed,
            "kv_pages": llm.num_pages, "kv_tokens": llm.num_pages * llm.page_size}


def yardstick_side_by_side(args, device: str, dtype: torch.dtype, settings: dict[str, dict]) -> dict:
    """The offline yardstick for two engine settings ``{key: LLM kwargs}`` (off first, on
    second): both engines alive side by side with the same KV pool, run in turn on
    ``args.yardstick_repeats`` workloads of the same distribution (a fresh seed each, so the
    prefix cache never serves a repeat). Returns each setting's runs, the on/off ratio of each
    repeat and their median (``args``: yardstick_shape, yardstick_len, yardstick_requests,
    yardstick_repeats, seed)."""
    lo, hi = (int(x) for x in args.yardstick_len.split(","))
    shape = args.yardstick_shape
    vocab = SHAPES[shape]["vocab_size"] if shape in SHAPES else 512
    workloads = [make_workload(args.yardstick_requests, lo, hi, vocab, args.seed + 100 * r)
                 for r in range(args.yardstick_repeats)]
    page_size = 16
    # Enough pages for the largest workload to hold every request at once: no retraction in either.
    need = max(sum(-(-(len(p) + n) // page_size) for p, n in zip(prompts, outs)) for prompts, outs in workloads)
    model_dir, dummy, _ = benchmark_checkpoint(shape)
    engines = {key: LLM(Path(model_dir), device=device, dtype=dtype, dummy_weights=dummy, num_pages=need + 64,
                        page_size=page_size, **kw) for key, kw in settings.items()}
    runs: dict[str, list[dict]] = {key: [] for key in engines}
    for prompts, out_lens in workloads:
        for key, llm in engines.items():
            runs[key].append(run_yardstick(llm, prompts, out_lens, device))
    del engines
    empty_cache(device)
    off, on = runs.values()
    ratios = [b["output_tok_s"] / a["output_tok_s"] for a, b in zip(off, on)]
    median = sorted(ratios)[len(ratios) // 2]
    print(f"offline yardstick ({shape}): {' / '.join(reversed(settings))} = "
          + ", ".join(f"{r:.3f}x" for r in ratios) + f" (median {median:.3f}x)")
    return {**runs, "speedups": ratios, "speedup": median, "kv_pages": need + 64}


def run_hf(model, device: str, prompts: list[list[int]], out_lens: list[int]) -> dict:
    """HF `generate`, one request at a time (greedy, never stopping early)."""
    hf_generate_batch(model, [prompts[0][:8]], [4], device)  # warm-up
    outs, elapsed = _timed(device, lambda: [hf_generate_batch(model, [p], [n], device)[0]
                                            for p, n in zip(prompts, out_lens)])
    produced = _count(outs, out_lens, "HF one at a time")
    return {"requests": len(prompts), "mode": "one request at a time", "output_tokens": produced,
            "time_s": elapsed, "output_tok_s": produced / elapsed}


def run_hf_batched(model, device: str, prompts: list[list[int]], out_lens: list[int], batch_size: int) -> dict:
    """HF `generate` in static, left-padded batches of ``batch_size`` (in workload order).

    Each batch runs until its longest requested output; only the tokens each request asked for
    are counted (``output_tokens``), the rest are waste (``generated_tokens`` counts them too).

    The warm-up runs the first batch in full, untimed: the first long batch in a process is much
    slower than the same batch again (H200, Qwen3-0.6B shape, 64 requests, up to 1023 new tokens:
    75 s, then 43 s), most likely the CUDA caching allocator growing along with HF's KV cache,
    which grows by concatenation every step.
    """
    batches = [range(i, min(i + batch_size, len(prompts))) for i in range(0, len(prompts), batch_size)]
    hf_generate_batch(model, [prompts[i] for i in batches[0]], [out_lens[i] for i in batches[0]], device)  # warm-up
    outs, elapsed = _timed(device, lambda: [o for b in batches for o in hf_generate_batch(
        model, [prompts[i] for i in b], [out_lens[i] for i in b], device)])
    produced = _count(outs, out_lens, "HF batched")
    generated = sum(len(b) * max(out_lens[i] for i in b) for b in batches)
    return {"requests": len(prompts),
            "mode": f"static batches of {batch_size}, left-padded, counting only requested tokens",
            "batch_size": batch_size, "output_tokens": produced, "generated_tokens": generated,
            "time_s": elapsed, "output_tok_s": produced / elapsed}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("offline", __doc__, threads=False, out="benchmarks/results/offline_<shape>_<device>.json")
    parser.add_argument("--model", help="checkpoint dir or hub id (real weights); overrides --shape")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"],
                        help="random weights of a real model's shape, or the tiny test model")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--hf-requests", type=int, default=4,
                        help="requests HF generate runs one at a time (0: skip)")
    parser.add_argument("--hf-batched-requests", type=int, default=None,
                        help="requests HF generate runs in static batches (default: all; 0: skip)")
    parser.add_argument("--hf-batch-size", type=int, default=64, help="static batch size of batched HF generate")
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--chunked-prefill-size", type=chunk_size, default="default",
                        help="tokens per step (lesson 6); 'none' prefills whole prompts (default: the LLM default)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (CPU runs; the tiny model only loses from more)")
    args = parser.parse_args(argv)
    if args.hf_batch_size < 1:
        parser.error("--hf-batch-size must be at least 1")

    if args.model:
        model_dir, dummy, name = args.model, False, Path(args.model).name
    else:
        model_dir, dummy, name = benchmark_checkpoint(args.shape)
    device = args.device
    dtype = benchmark_dtype(device, args.threads)

    chunking = {} if args.chunked_prefill_size == "default" else {"chunked_prefill_size": args.chunked_prefill_size}
    llm = LLM(model_dir, device=device, dtype=dtype, dummy_weights=dummy,
              page_size=args.page_size, max_running=args.max_running, **chunking)
    chunked_prefill_size = llm.scheduler.config.chunked_prefill_size
    prompts, out_lens = make_workload(args.num_requests, args.min_len, args.max_len, llm.config.vocab_size, args.seed)

    engine = run_yardstick(llm, prompts, out_lens, device)
    backend_name = type(llm.engine.backend).__name__
    del llm
    empty_cache(device)

    results: dict = {"engine": engine}
    k_one = min(args.hf_requests, len(prompts))
    k_batched = len(prompts) if args.hf_batched_requests is None else min(args.hf_batched_requests, len(prompts))
    if k_one > 0 or k_batched > 0:
        model = load_hf(Path(model_dir), dummy, dtype, device)
        runs = [("hf", "one at a time", k_one, lambda k: run_hf(model, device, prompts[:k], out_lens[:k])),
                ("hf_batched", f"static batches of {args.hf_batch_size}", k_batched,
                 lambda k: run_hf_batched(model, device, prompts[:k], out_lens[:k], args.hf_batch_size))]
        for key, label, k, run in runs:
            if k <= 0:
                continue
            hf = results[key] = run(k)
            speedup = results[f"speedup_vs_{key}"] = engine["output_tok_s"] / hf["output_tok_s"]
            print(f"HF generate, {label} ({k} request{'s' * (k != 1)}): {hf['output_tokens']} tokens in {hf['time_s']:.2f} s = "
                  f"{hf['output_tok_s']:.1f} out tok/s -> minisgl is {speedup:.1f}x")
        del model
    config = {"model": name, "dummy_weights": dummy, "device": device, "dtype": str(dtype).replace("torch.", ""),
              "num_requests": args.num_requests, "hf_requests": k_one, "hf_batched_requests": k_batched,
              "hf_batch_size": args.hf_batch_size, "len_range": [args.min_len, args.max_len], "ignore_eos": True,
              "max_running": args.max_running, "page_size": args.page_size, "seed": args.seed, "prefix_cache": True,
              "chunked_prefill_size": chunked_prefill_size,
              "cpu_threads": torch.get_num_threads(),
              "attention_backend": backend_name}
    out = args.out or f"benchmarks/results/offline_{name}_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'offline', config, results)}")


if __name__ == "__main__":
    main()
