"""Offline throughput benchmark: the engine against Hugging Face `generate`, in one run.

The yardstick workload (nano-vllm / mini-sglang style): 256 requests, input and output lengths
uniform in 100..1024, random token ids, ``ignore_eos``, Qwen3-0.6B shape with random weights
(speed does not depend on weight values). On a CPU, scale it down:

    python -m minisgl.bench offline                                   # GPU yardstick
    python -m minisgl.bench offline --shape tiny --num-requests 64 \\
        --min-len 16 --max-len 64 --hf-requests 64                    # CPU, tiny model

HF `generate` runs the first ``--hf-requests`` requests of the same workload one at a time
(batch size 1, the way a naive server would) in the same process; the JSON reports both
throughputs and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from minisgl.bench.results import write_result
from minisgl.llm import LLM, default_device
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
}


def shape_checkpoint(shape: str) -> Path:
    """A directory with the real model's config.json (no weights: load with dummy_weights) and a
    small tokenizer borrowed from the tiny test checkpoint (the benchmark feeds token ids)."""
    from minisgl.testing import tiny_checkpoint

    tiny = tiny_checkpoint("qwen3")
    out = Path(tempfile.mkdtemp(prefix=f"minisgl-{shape}-"))
    (out / "config.json").write_text(json.dumps(SHAPES[shape]))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((tiny / name).read_bytes())
    return out


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


def run_hf(model_dir: Path, dummy: bool, dtype: torch.dtype, device: str,
           prompts: list[list[int]], out_lens: list[int]) -> dict:
    """HF `generate`, one request at a time (greedy, never stopping early)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    if dummy:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    model.eval()
    model.generation_config.eos_token_id = None

    def generate(ids: list[int], n: int) -> int:
        cfg = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
        x = torch.tensor([ids], device=device)
        with torch.inference_mode():
            return model.generate(x, attention_mask=torch.ones_like(x), generation_config=cfg).shape[1] - len(ids)

    generate(prompts[0][:8], 4)  # warm-up
    sync(device)
    start = time.perf_counter()
    produced = sum(generate(p, n) for p, n in zip(prompts, out_lens))
    sync(device)
    elapsed = time.perf_counter() - start
    return {"requests": len(prompts), "mode": "one request at a time", "output_tokens": produced,
            "time_s": elapsed, "output_tok_s": produced / elapsed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint dir or hub id (real weights); overrides --shape")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"],
                        help="random weights of a real model's shape, or the tiny test model")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--hf-requests", type=int, default=4, help="requests HF generate runs (0: skip)")
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (CPU runs; the tiny model only loses from more)")
    parser.add_argument("--out", default=None, help="JSON result path (default benchmarks/results/offline_<shape>_<device>.json)")
    args = parser.parse_args(argv)

    if args.model:
        model_dir, dummy, name = args.model, False, Path(args.model).name
    elif args.shape == "tiny":
        from minisgl.testing import tiny_checkpoint

        model_dir, dummy, name = tiny_checkpoint("qwen3"), False, "tiny-qwen3"
    else:
        model_dir, dummy, name = shape_checkpoint(args.shape), True, args.shape
    device = args.device
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32

    llm = LLM(model_dir, device=device, dtype=dtype, dummy_weights=dummy,
              page_size=args.page_size, max_running=args.max_running)
    prompts, out_lens = make_workload(args.num_requests, args.min_len, args.max_len, llm.config.vocab_size, args.seed)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in out_lens]

    llm.generate(prompts[:2], [SamplingParams(max_tokens=8, ignore_eos=True)] * 2, progress=False)  # warm-up
    sync(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(device)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == sum(out_lens), "ignore_eos requests must produce exactly max_tokens each"
    engine = {"requests": len(prompts), "input_tokens": sum(map(len, prompts)), "output_tokens": produced,
              "time_s": elapsed, "output_tok_s": produced / elapsed,
              "kv_pages": llm.pool.num_pages, "kv_tokens": llm.pool.num_pages * args.page_size}
    backend_name = type(llm.engine.backend).__name__
    print(f"minisgl: {produced} tokens in {elapsed:.2f} s = {produced / elapsed:.1f} out tok/s")
    del llm
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    results: dict = {"engine": engine}
    if args.hf_requests > 0:
        k = min(args.hf_requests, len(prompts))
        hf = run_hf(Path(model_dir), dummy, dtype, device, prompts[:k], out_lens[:k])
        results["hf"] = hf
        results["speedup_vs_hf"] = engine["output_tok_s"] / hf["output_tok_s"]
        print(f"HF generate: {hf['output_tokens']} tokens in {hf['time_s']:.2f} s = {hf['output_tok_s']:.1f} out tok/s "
              f"-> minisgl is {results['speedup_vs_hf']:.1f}x")
    config = {"model": name, "dummy_weights": dummy, "device": device, "dtype": str(dtype).replace("torch.", ""),
              "num_requests": args.num_requests, "len_range": [args.min_len, args.max_len], "ignore_eos": True,
              "max_running": args.max_running, "page_size": args.page_size, "seed": args.seed,
              "cpu_threads": torch.get_num_threads(),
              "attention_backend": backend_name}
    out = args.out or f"benchmarks/results/offline_{name}_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'offline', config, results)}")


if __name__ == "__main__":
    main()
