"""Lesson 1 smoke run: greedy generation with a contiguous KV cache, side by side with Hugging Face.

    python lessons/l01/smoke.py                      # all three tiny architectures
    python lessons/l01/smoke.py --arch llama --prompt "Once upon a time" --max-new-tokens 24
    python lessons/l01/smoke.py --model /path/to/Qwen3-0.6B   # a real HF checkpoint directory
    python lessons/l01/smoke.py --mine               # YOUR lessons/l01/exercise.py (--mine-file PATH: another file)

The last line is MATCH (every token identical to HF's) or MISMATCH (and the exit code is 1).
"""

from __future__ import annotations

import argparse
import sys

import torch

from minisgl.attention.contiguous import ContiguousBackend
from minisgl.generate import generate
from minisgl.kvcache import ContiguousKVCache
from minisgl.models import load_model
from minisgl.testing import ARCHITECTURES, HFReference, first_difference, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l01/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(1)


def run_one(name: str, path, prompt: str, max_new_tokens: int) -> bool:
    """Generate with minisgl and with HF from the checkpoint at ``path``; print both; True if equal."""
    model = load_model(path, dtype=torch.float32)  # CPU, float32: exact parity with HF
    tokenizer = load_tokenizer(path)
    prompt_ids = tokenizer.encode(prompt)
    stop_ids = model.config.eos_token_ids  # Llama 3 has several

    # One request, one slab per layer: [max_seq_len, H_kv, D] for K and the same for V.
    cache = ContiguousKVCache.for_model(model.config, len(prompt_ids) + max_new_tokens, torch.float32, "cpu")
    ours = generate(model, ContiguousBackend(cache), prompt_ids, max_new_tokens, stop_token_ids=stop_ids)
    theirs = HFReference(path).greedy(prompt_ids, max_new_tokens, stop_token_ids=stop_ids)

    ok = ours == theirs
    print(f"=== {name}: {path}")
    print(f"prompt      : {prompt!r} -> {len(prompt_ids)} tokens {prompt_ids}")
    print(f"KV reserved : {cache.nbytes:,} bytes ({cache.max_seq_len} positions x {model.config.num_layers} layers x K,V)")
    print(f"minisgl ids : {ours}")
    print(f"HF      ids : {theirs}")
    print(f"minisgl text: {tokenizer.decode(ours)!r}")
    print(f"HF      text: {tokenizer.decode(theirs)!r}")
    if not ok:
        first = first_difference(ours, theirs)
        print(f"first difference at new token {first}")
    print(f"{name}: {'MATCH' if ok else 'MISMATCH'}\n")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHITECTURES, help="one tiny architecture (default: all three)")
    parser.add_argument("--model", help="a real HF checkpoint directory (or hub id) instead of the tiny ones")
    parser.add_argument("--prompt", default="The key and value vectors")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    args = parser.parse_args()

    if args.model:
        runs = [("model", args.model)]
    else:
        archs = [args.arch] if args.arch else list(ARCHITECTURES)
        runs = [(arch, tiny_checkpoint(arch)) for arch in archs]  # built offline, random weights
    results = [run_one(name, path, args.prompt, args.max_new_tokens) for name, path in runs]
    print("MATCH" if all(results) else "MISMATCH")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
