"""Lesson 11 smoke run: a mixture-of-experts model through the engine, beside Hugging Face.

    python lessons/l11/smoke.py                              # tiny Qwen3-MoE: 8 experts, top-2, every layer
    python lessons/l11/smoke.py --checkpoint sparse_step     # dense layers between, top-k not renormalised
    python lessons/l11/smoke.py --checkpoint shared_expert   # tiny Qwen2-MoE, with a shared expert
    python lessons/l11/smoke.py --tp 2 --ep 2                # expert parallelism: two CPU processes (gloo)
    python lessons/l11/smoke.py --model /path/to/Qwen3-30B-A3B --device cuda
    python lessons/l11/smoke.py --mine                       # YOUR lessons/l11/exercise.py (--mine-file PATH: another file)

Prints the model's experts (how many, how many each token uses, which layers are sparse, the
expert weights per layer against those one token touches), then how the router spread the
tokens of a small workload over the experts of each MoE layer (``expert_usage``: the busiest
expert against the mean, the idlest), then generates prompts of different lengths in one
batch with ``LLM`` and prints our tokens beside Hugging Face's for each prompt alone. The last
line is MATCH (every request identical) or MISMATCH (exit 1).
"""

from __future__ import annotations

import argparse
import sys

import torch

from minisgl import LLM, SamplingParams
from minisgl.config import ModelConfig
from minisgl.layers.moe import MoELayers
from minisgl.models import load_model
from minisgl.testing import SPARSE_MOE_KWARGS, TEST_PROMPTS, HFReference, expert_usage, first_difference, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l11/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(11)

CHECKPOINTS = {"every_layer": ("qwen3_moe", {}), "sparse_step": ("qwen3_moe", SPARSE_MOE_KWARGS),
               "shared_expert": ("qwen2_moe", {})}


def describe(config: ModelConfig) -> None:
    """The experts of ``config``: counts, sparse layers, weights per layer against per token."""
    sparse = [i for i in range(config.num_layers) if config.is_moe_layer(i)]
    expert = 3 * config.hidden_size * config.moe_intermediate_size  # gate, up, down of one expert
    print(f"{config.architecture}: {config.num_experts} experts per MoE layer, top-{config.num_experts_per_tok}, "
          f"renormalised: {config.norm_topk_prob}, MoE layers {sparse} of {config.num_layers}"
          + (f", shared expert {config.shared_expert_intermediate_size} wide" if config.shared_expert_intermediate_size
             else ""))
    print(f"one MoE layer: {config.num_experts} x {expert:,} = {config.num_experts * expert:,} expert weights; "
          f"a token uses {config.num_experts_per_tok} x {expert:,} = {config.num_experts_per_tok * expert:,} "
          f"({config.num_experts_per_tok / config.num_experts:.0%})\n")


def routing(model, prompts: list[list[int]]) -> None:
    """How often each expert was chosen, per MoE layer, over every token of ``prompts``."""
    tokens = sum(len(p) for p in prompts)
    print(f"routing of {len(prompts)} prompts, {tokens} tokens (each token chooses top-k: counts sum to k x tokens):")
    for layer, counts in expert_usage(model, prompts).items():
        mean = counts.float().mean().item()
        print(f"  layer {layer}: {counts.tolist()}  busiest {counts.max().item()} = {counts.max().item() / mean:.2f}x "
              f"the mean {mean:.1f}, idlest {counts.min().item()}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", choices=CHECKPOINTS, default="every_layer", help="which tiny MoE checkpoint")
    parser.add_argument("--model", help="a real HF checkpoint directory (or hub id) instead of the tiny one")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (processes)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks: 1 or --tp")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a tiny model's ops are too short to share between threads

    arch, overrides = CHECKPOINTS[args.checkpoint]
    path = args.model or tiny_checkpoint(arch, **overrides)
    config = ModelConfig.from_dir(path)
    describe(config)
    tok = load_tokenizer(path)
    prompts = [tok.encode(p) for p in TEST_PROMPTS]
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    if args.tp == 1 or not args.model:  # (under TP a real model lives in the ranks only)
        routing(load_model(path, dtype=dtype, device=args.device, layers=MoELayers()), prompts)

    max_tokens = [12, 20, 8, 16, 24]
    with LLM(path, device=args.device, tp_size=args.tp, ep_size=args.ep, max_running=4, page_size=4,
             chunked_prefill_size=16) as llm:
        outs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens], progress=False)
    print(f"LLM(tp_size={args.tp}, ep_size={args.ep}): {len(prompts)} prompts in one batch, each beside HF alone")
    hf = HFReference(path, dtype=dtype, device=args.device)
    ok = True
    for i, (prompt, n, out) in enumerate(zip(prompts, max_tokens, outs)):
        theirs = hf.greedy(prompt, n)
        same = out.token_ids == theirs
        ok &= same
        print(f"request {i} ({len(prompt)} prompt tokens)")
        print(f"  minisgl: {out.token_ids}")
        print(f"  HF     : {theirs}")
        print(f"  {'MATCH' if same else f'MISMATCH, first difference at new token {first_difference(out.token_ids, theirs)}'}")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
