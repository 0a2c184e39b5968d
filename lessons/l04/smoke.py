"""Lesson 4 smoke run: many requests through the continuous-batching `LLM`, each checked against HF alone.

    python lessons/l04/smoke.py                         # 16 prompts on the tiny Llama
    python lessons/l04/smoke.py --arch qwen3 --num-pages 40 --max-running 4   # a tight KV pool
    python lessons/l04/smoke.py --model /path/to/Qwen3-0.6B   # a real HF checkpoint directory
    python lessons/l04/smoke.py --mine                  # YOUR lessons/l04/exercise.py (--mine-file PATH: another file)

The prompts mix text, chat messages and token ids of different lengths, with different
``max_tokens``; they are all given to one ``LLM.generate`` call, which batches them. Each
request's tokens are compared with Hugging Face generating that prompt on its own. The table
shows one row per request; the last line is MATCH (all identical) or MISMATCH (exit code 1).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import ARCHITECTURES, TEST_PROMPTS, HFReference, first_difference, tiny_checkpoint

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l04/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(4)


def make_prompts(n: int, vocab_size: int, seed: int = 0) -> list:
    """Text prompts, two chats and random token-id prompts (1..80 tokens), ``n`` in all."""
    rng = random.Random(seed)
    chats = [
        [{"role": "user", "content": "What does a KV cache store?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain paged attention."}],
    ]
    prompts: list = list(TEST_PROMPTS) + chats
    while len(prompts) < n:
        prompts.append([rng.randrange(8, vocab_size) for _ in range(rng.randint(1, 80))])
    return prompts[:n]


def describe(prompt) -> str:
    if isinstance(prompt, str):
        return f"text {prompt[:22]!r}"
    if isinstance(prompt[0], dict):
        return f"chat ({len(prompt)} msgs)"
    return "token ids"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHITECTURES, default="llama", help="tiny architecture (default llama)")
    parser.add_argument("--model", help="a real HF checkpoint directory (or hub id) instead of the tiny one")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--num-pages", type=int, default=256, help="KV pool size in pages")
    parser.add_argument("--page-size", type=int, default=4)
    parser.add_argument("--max-running", type=int, default=64, help="largest decode batch")
    args = parser.parse_args()

    path = args.model or tiny_checkpoint(args.arch)  # tiny: built offline, random weights
    if not args.model:
        torch.set_num_threads(1)  # a tiny model's ops are too short to share between threads
    llm = LLM(path, num_pages=args.num_pages, page_size=args.page_size, max_running=args.max_running,
              prefix_cache=False)  # lesson 4: every request owns its pages
    prompts = make_prompts(args.num_prompts, llm.config.vocab_size)
    rng = random.Random(1)
    params = [SamplingParams(max_tokens=rng.randint(8, 48)) for _ in prompts]  # greedy, stops at any EOS id

    # Count what the scheduler does: wrap its schedule() to note every batch it builds.
    steps = {"prefill": 0, "decode": 0}
    largest_decode = 0
    schedule = llm.scheduler.schedule

    def counting_schedule():
        nonlocal largest_decode
        batch = schedule()
        if batch is not None:
            steps[batch.mode] += 1
            if batch.mode == "decode":
                largest_decode = max(largest_decode, batch.size)
        return batch

    llm.scheduler.schedule = counting_schedule

    start = time.perf_counter()
    outs = llm.generate(prompts, params, progress=False)
    elapsed = time.perf_counter() - start

    hf = HFReference(path, dtype=llm.dtype, device=llm.device)
    eos = list(llm.config.eos_token_ids)
    print(f"model: {path}  ({llm.config.architecture}, EOS ids {eos})")
    print(f"KV pool: {args.num_pages} pages x {args.page_size} tokens, max_running {args.max_running}\n")
    print(f"{'#':>3}  {'prompt':<30} {'len':>4} {'max':>4} {'out':>4}  {'finish':<7} result")
    all_ok = True
    for i, (prompt, p, out) in enumerate(zip(prompts, params, outs)):
        theirs = hf.greedy(out.prompt_token_ids, p.max_tokens, stop_token_ids=eos)
        ok = out.token_ids == theirs
        all_ok &= ok
        where = "" if ok else f"  first difference at token {first_difference(out.token_ids, theirs)}"
        print(f"{i:>3}  {describe(prompt):<30} {len(out.prompt_token_ids):>4} {p.max_tokens:>4} {len(out.token_ids):>4}  "
              f"{out.finish_reason:<7} {'MATCH' if ok else 'MISMATCH'}{where}")
    produced = sum(len(o.token_ids) for o in outs)
    print(f"\n{len(prompts)} requests, {produced} new tokens in {elapsed:.2f} s ({produced / elapsed:.0f} tok/s)")
    print(f"scheduler steps: {steps['prefill'] + steps['decode']} ({steps['prefill']} prefill, {steps['decode']} decode); "
          f"largest decode batch: {largest_decode}")
    print(f"one request at a time would take {produced} forward passes ({sum(p.max_tokens for p in params)} at most)")
    free = llm.scheduler.kv.allocator.num_free
    print(f"KV pages free after the run: {free}/{args.num_pages}")
    ok = all_ok and free == args.num_pages
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
