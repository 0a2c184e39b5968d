"""Lesson 9 smoke run: one model over two processes, compared with Hugging Face.

    python lessons/l09/smoke.py                      # tiny Qwen3, TP=2 over gloo on the CPU
    python lessons/l09/smoke.py --arch llama --tp 2
    python lessons/l09/smoke.py --model /path/to/Qwen3-0.6B --device cuda   # two GPUs, NCCL
    python lessons/l09/smoke.py --mine               # YOUR lessons/l09/exercise.py (--mine-file PATH: another file)

Prints what each rank holds (its heads, its MLP columns, its rows of the vocabulary, the bytes
of one layer) and what crosses the wire per layer, starts the ranks with ``LLM(tp_size=...)``,
generates greedily for a few prompts of different lengths in one batch, compares every request
with Hugging Face's tokens for its prompt alone, and checks that no rank process outlives the
``with`` block. The last line is MATCH or MISMATCH (exit 1).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from minisgl import LLM, SamplingParams
from minisgl.config import ModelConfig
from minisgl.testing import HFReference, first_difference, process_alive, tiny_checkpoint
from minisgl.utils import cdiv

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l09/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(9)


def describe(config: ModelConfig, tp: int, itemsize: int) -> None:
    """What one rank holds and what one layer sends, from the sharded config."""
    rank = config.shard(tp)
    h, d = config.hidden_size, config.head_dim
    layer = {  # weights of one decoder layer, per rank (elements)
        "q, k, v (column-parallel)": h * (rank.num_heads + 2 * rank.num_kv_heads) * d,
        "o_proj (row-parallel)": rank.num_heads * d * h,
        "gate, up (column-parallel)": 2 * h * rank.intermediate_size,
        "down_proj (row-parallel)": rank.intermediate_size * h,
    }
    print(f"each of {tp} ranks: {rank.num_heads} of {config.num_heads} query heads, {rank.num_kv_heads} of "
          f"{config.num_kv_heads} KV heads, {rank.intermediate_size} of {config.intermediate_size} MLP columns, "
          f"{cdiv(config.vocab_size, tp)} of {config.vocab_size} vocabulary rows")
    for name, n in layer.items():
        print(f"  {name:<28} {n * itemsize:>12,} B")
    weights = sum(layer.values()) * itemsize
    wire = 2 * h * itemsize
    print(f"  one layer, this rank: {weights:,} B of weights; per token it all-reduces 2 x {h} values = "
          f"{wire:,} B ({weights // wire:,}x less)\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint dir (default: the tiny test checkpoint of --arch)")
    parser.add_argument("--arch", default="qwen3", choices=["qwen3", "llama", "qwen2"])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)

    path = args.model or tiny_checkpoint(args.arch)
    config = ModelConfig.from_dir(path)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    describe(config, args.tp, torch.empty((), dtype=dtype).element_size())

    rng = random.Random(9)
    prompts = [[rng.randrange(8, config.vocab_size) for _ in range(rng.randint(3, 40))] for _ in range(5)]
    max_tokens = [12, 5, 9, 16, 7]
    with LLM(path, device=args.device, tp_size=args.tp, max_seq_len=128, max_running=4,
             chunked_prefill_size=16) as llm:
        pids = llm.core.ranks.pids
        print(f"ranks: pids {pids}, all-reduce through {llm.core.all_reduce}, {llm.num_pages} KV pages each")
        outs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens],
                            progress=False)
    left = [pid for pid in pids if process_alive(pid)]
    print(f"after the with block: {len(left)} rank processes left {left if left else ''}\n")

    hf = HFReference(path, dtype=dtype, device=args.device)
    ok = not left
    for i, (prompt, n, out) in enumerate(zip(prompts, max_tokens, outs)):
        ref = hf.greedy(prompt, n)
        same = out.token_ids == ref
        ok &= same
        where = "" if same else f"  first difference at token {first_difference(out.token_ids, ref)}"
        print(f"request {i}: prompt {len(prompt):>2} tokens, {len(out.token_ids):>2} generated  "
              f"{'MATCH' if same else 'MISMATCH'}{where}")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
