"""Lesson 5 smoke run: shared prefixes through the radix cache, each request checked against HF alone.

    python lessons/l05/smoke.py                                # tiny Qwen3, a roomy pool
    python lessons/l05/smoke.py --num-pages 24 --page-size 4   # a tight pool: eviction and retraction
    python lessons/l05/smoke.py --model /path/to/Qwen3-0.6B     # a real HF checkpoint directory
    python lessons/l05/smoke.py --mine                         # YOUR lessons/l05/exercise.py (--mine-file PATH: another file)

Three "system prompts" are shared by groups of questions, one question is asked twice, and a
second chat turn extends the first turn's prompt and answer. The requests arrive in two waves
(two ``generate`` calls), so the second wave finds the first wave's KV in the tree. One row per
request: prompt length, prompt tokens served from the cache, and whether our tokens equal
Hugging Face's for that prompt alone. The last line is MATCH (all identical, every page
accounted for) or MISMATCH (exit code 1).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import HFReference, first_difference, tiny_checkpoint

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l05/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(5)


def waves(vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Two waves of prompts over three shared system prompts (random ids above the specials)."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(8, vocab) for _ in range(n)]  # noqa: E731
    systems = [ids(48), ids(40), ids(33)]
    first = [systems[i % 3] + ids(rng.randint(3, 12)) for i in range(6)]
    second = [systems[i % 3] + ids(rng.randint(3, 12)) for i in range(6)] + [first[0]]
    return first, second


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint dir (default: the tiny Qwen3 test checkpoint)")
    parser.add_argument("--num-pages", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)

    path = args.model or tiny_checkpoint("qwen3")
    llm = LLM(path, num_pages=args.num_pages, page_size=args.page_size, max_running=8, max_seq_len=256)
    hf = HFReference(path, dtype=llm.dtype, device=llm.device)
    first, second = waves(llm.config.vocab_size)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(first, params, progress=False)
    turn2 = first[1] + outs[1].token_ids + [9, 10, 11]  # a second chat turn: prompt + answer + more
    second.append(turn2)
    outs += llm.generate(second, params, progress=False)
    elapsed = time.perf_counter() - start

    print(f"model: {path}\nKV pool: {args.num_pages} pages x {args.page_size} tokens\n")
    print(f"{'#':>3}  {'wave':>4}  {'prompt':>6}  {'cached':>6}  result")
    all_ok = True
    for i, (prompt, out) in enumerate(zip(first + second, outs)):
        theirs = hf.greedy(prompt, args.max_tokens)
        ok = out.token_ids == theirs
        all_ok &= ok
        where = "" if ok else f"  first difference at token {first_difference(out.token_ids, theirs)}"
        print(f"{i:>3}  {1 if i < len(first) else 2:>4}  {len(prompt):>6}  {out.num_cached_tokens:>6}  "
              f"{'MATCH' if ok else 'MISMATCH'}{where}")
    kv = llm.scheduler.kv
    stats = kv.stats
    print(f"\n{len(outs)} requests in {elapsed:.2f} s; prompt tokens {stats.prompt_tokens}, "
          f"{stats.hit_tokens} from the cache ({stats.hit_rate:.0%})")
    print(f"evicted pages: {stats.evicted_pages}, retractions: {stats.retractions}")
    print(f"pages: {kv.allocator.num_free} free + {kv.tree.total_pages} in the tree = {args.num_pages} "
          f"({kv.tree.protected_pages} locked)")
    accounted = kv.allocator.num_free + kv.tree.total_pages == args.num_pages and kv.tree.protected_pages == 0
    ok = all_ok and accounted
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
