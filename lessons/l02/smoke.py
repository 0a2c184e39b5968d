"""Lesson 2 smoke run: several requests decode interleaved over ONE paged KV pool, side by side with HF.

    python lessons/l02/smoke.py                          # all three tiny architectures, block size 16
    python lessons/l02/smoke.py --arch llama --block-size 1
    python lessons/l02/smoke.py --prompt "Once upon a time" --prompt "The quick brown fox"
    python lessons/l02/smoke.py --model /path/to/Qwen3-0.6B    # a real HF checkpoint directory
    python lessons/l02/smoke.py --mine                   # YOUR lessons/l02/exercise.py (--mine-file PATH: another file)

Every request gets its own block table over the same pool and allocator; the driver steps the
requests round-robin (one forward each, in turn), printing how many blocks are in use. Each
request's tokens are then compared with HF generating that prompt alone. The last line is MATCH
(every token identical) or MISMATCH (and the exit code is 1).
"""

from __future__ import annotations

import argparse
import sys

import torch

from minisgl.attention.token_paged import PagedSequence
from minisgl.generate import SequenceGenerator
from minisgl.kvcache import BlockAllocator, OutOfBlocksError, TokenKVPool
from minisgl.models import load_model
from minisgl.testing import ARCHITECTURES, TEST_PROMPTS, HFReference, first_difference, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer
from minisgl.utils import cdiv

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l02/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(2)


def pool_usage(allocator: BlockAllocator) -> str:
    return f"blocks used {allocator.num_allocated:>3}/{allocator.num_blocks} (free {allocator.num_free})"


def run_one(name: str, path, prompts: list[str], max_new_tokens: int, block_size: int, num_blocks: int | None) -> bool:
    """Generate every prompt interleaved over one pool, and each alone with HF; print both; True if all equal."""
    model = load_model(path, dtype=torch.float32)  # CPU, float32: exact parity with HF
    tokenizer = load_tokenizer(path)
    prompt_ids = [tokenizer.encode(p) for p in prompts]
    stop_ids = model.config.eos_token_ids

    # Default pool: exactly enough blocks for every request's worst case (prompt + new tokens).
    if num_blocks is None:
        num_blocks = sum(cdiv(len(ids) + max_new_tokens, block_size) for ids in prompt_ids)
    pool = TokenKVPool.for_model(model.config, num_blocks * block_size, torch.float32, "cpu")
    allocator = BlockAllocator(num_blocks)
    pool_bytes = sum(t.numel() * t.element_size() for t in pool.k + pool.v)
    print(f"=== {name}: {path}")
    print(f"pool        : {num_blocks} blocks x {block_size} slots = {pool.num_slots} slots, {pool_bytes:,} bytes "
          f"(per layer K and V: [{pool.num_slots}, {model.config.num_kv_heads}, {model.config.head_dim}])")

    gens = [
        SequenceGenerator(model, PagedSequence(pool, allocator, block_size), ids, max_new_tokens, stop_ids)
        for ids in prompt_ids
    ]
    step, peak = 0, 0
    while not all(g.finished for g in gens):
        for i, g in enumerate(gens):  # round-robin: one forward per running request
            if not g.finished:
                try:
                    g.step()
                except OutOfBlocksError as err:  # --num-blocks too small: no scheduler yet (lesson 4)
                    print(f"request {i} at step {step + 1}: {err}")
                    for other in gens:
                        if not other.finished:
                            other.kv.release()
                    print(f"released every running request: {pool_usage(allocator)}")
                    print(f"{name}: MISMATCH (out of KV blocks)\n")
                    return False
                peak = max(peak, allocator.num_allocated)
        step += 1
        if step == 1:
            for i, g in enumerate(gens):
                blocks = g.kv.table.blocks if not g.finished else []
                print(f"after prefill: request {i} ({len(prompt_ids[i])} prompt tokens) holds blocks {blocks}")
        if step == 1 or step % 8 == 0 or all(g.finished for g in gens):
            running = sum(not g.finished for g in gens)
            print(f"step {step:>3}: {running} running, {pool_usage(allocator)}")

    ok_all = True
    for i, (g, ids) in enumerate(zip(gens, prompt_ids)):
        theirs = HFReference(path).greedy(ids, max_new_tokens, stop_token_ids=stop_ids)
        ours = g.output_ids
        ok = ours == theirs
        ok_all &= ok
        print(f"--- request {i}: {prompts[i]!r} -> {len(ids)} tokens")
        print(f"minisgl ids : {ours}")
        print(f"HF      ids : {theirs}")
        print(f"minisgl text: {tokenizer.decode(ours)!r}")
        if not ok:
            first = first_difference(ours, theirs)
            print(f"first difference at new token {first}")
        print(f"request {i}: {'MATCH' if ok else 'MISMATCH'}")
    leaked = allocator.num_allocated
    print(f"peak usage  : {peak}/{allocator.num_blocks} blocks")
    print(f"after all requests finished: {pool_usage(allocator)}" + (f"  LEAK: {leaked} blocks!" if leaked else ""))
    ok_all &= leaked == 0
    print(f"{name}: {'MATCH' if ok_all else 'MISMATCH'}\n")
    return ok_all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHITECTURES, help="one tiny architecture (default: all three)")
    parser.add_argument("--model", help="a real HF checkpoint directory (or hub id) instead of the tiny ones")
    parser.add_argument("--prompt", action="append", help="a prompt (repeat for several; default: the test prompts)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, help="pool size in blocks (default: enough for every request)")
    args = parser.parse_args()

    prompts = args.prompt or list(TEST_PROMPTS)
    if args.model:
        runs = [("model", args.model)]
    else:
        archs = [args.arch] if args.arch else list(ARCHITECTURES)
        runs = [(arch, tiny_checkpoint(arch)) for arch in archs]  # built offline, random weights
    results = [run_one(name, path, prompts, args.max_new_tokens, args.block_size, args.num_blocks) for name, path in runs]
    print("MATCH" if all(results) else "MISMATCH")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
