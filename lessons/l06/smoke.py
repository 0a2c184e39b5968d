"""Lesson 6 smoke run: a long prompt in chunks, short requests joining while it is chunked.

    python lessons/l06/smoke.py                          # tiny Qwen3, a budget of 32 tokens per step
    python lessons/l06/smoke.py --budget 0               # no chunking: whole prompts, for comparison
    python lessons/l06/smoke.py --model /path/to/Qwen3-0.6B --budget 512 --long-len 4000
    python lessons/l06/smoke.py --mine                   # YOUR lessons/l06/exercise.py (--mine-file PATH: another file)

Time is counted in tokens: the clock advances by the tokens each step computes (on a GPU a
step's time grows with its tokens, so this is a fair, reproducible stand-in for seconds). A
``--long-len``-token prompt arrives at 0 and ``--num-short`` short requests arrive evenly
while it would be prefilled in one piece; a request that arrives during a step waits for it.

Each step is printed as the rows of its batch: ``d`` a decode token, ``c<n>`` a non-final
chunk of n tokens (no token sampled), ``p<n>`` a whole prompt or a final chunk of n tokens (a
token sampled). Then one row per request: its arrival, its first token (step and clock) and
its TTFT in tokens, and whether its tokens equal Hugging Face's for that prompt alone. The
last line is MATCH (all identical, every page accounted for) or MISMATCH (exit code 1).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from minisgl import LLM, SamplingParams
from minisgl.core import Batch
from minisgl.testing import HFReference, first_difference, tiny_checkpoint

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l06/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(6)


def describe(batch: Batch) -> str:
    """One batch as its rows: ``r3:d`` (decode), ``r0:c32`` (non-final chunk), ``r1:p7`` (sampling prefill)."""
    rows = []
    for req, n, samples in zip(batch.reqs, batch.extend_lens, batch.samples):
        kind = "d" if req.decoding else ("p" if samples else "c") + str(n)
        rows.append(f"r{req.rid}:{kind}")
    return " ".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint dir (default: the tiny Qwen3 test checkpoint)")
    parser.add_argument("--budget", type=int, default=32, help="chunked_prefill_size; 0: whole prompts")
    parser.add_argument("--long-len", type=int, default=200)
    parser.add_argument("--num-short", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)

    path = args.model or tiny_checkpoint("qwen3")
    llm = LLM(path, num_pages=256, page_size=4, max_running=8, max_seq_len=args.long_len + args.max_tokens,
              chunked_prefill_size=args.budget or None)
    rng = random.Random(0)
    vocab = llm.config.vocab_size
    prompts = [[rng.randrange(8, vocab) for _ in range(args.long_len)]]
    prompts += [[rng.randrange(8, vocab) for _ in range(rng.randint(4, 12))] for _ in range(args.num_short)]
    gap = args.long_len // (args.num_short + 1)
    arrivals = [gap * i for i in range(len(prompts))]  # in tokens computed so far
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)

    sched = llm.scheduler
    reqs, first_token, clock, step = [], {}, 0, 0
    print(f"model: {path}\nbudget: {args.budget or 'none (whole prompts)'} tokens per step\n")
    while len(reqs) < len(prompts) or sched.has_work:
        if not sched.has_work:
            clock = max(clock, arrivals[len(reqs)])  # idle: jump to the next arrival
        while len(reqs) < len(prompts) and arrivals[len(reqs)] <= clock:
            reqs.append(sched.add_request(prompts[len(reqs)], params))
        batch = sched.schedule()
        rows = describe(batch)  # before processing changes who is decoding
        sched.process(batch, sched.engine.step(batch))
        clock += sum(batch.extend_lens)
        if step < 20:
            print(f"step {step:>3}  clock {clock:>5}  [{batch.mode:>7}, {sum(batch.extend_lens):>4} tokens]  {rows}")
        for req in batch.sampling_reqs:
            first_token.setdefault(req.rid, (step, clock))
        step += 1
    print(f"... {step} steps in all\n")

    hf = HFReference(path, dtype=llm.dtype, device=llm.device)
    print(f"{'req':>4}  {'prompt':>6}  {'arrived':>7}  {'first token':>17}  {'TTFT':>6}  result")
    all_ok = True
    for req, prompt, arrived in zip(reqs, prompts, arrivals):
        theirs = hf.greedy(prompt, args.max_tokens)
        ok = req.output_ids == theirs
        all_ok &= ok
        where = "" if ok else f"  first difference at token {first_difference(req.output_ids, theirs)}"
        at_step, at_clock = first_token[req.rid]
        print(f"{'r' + str(req.rid):>4}  {len(prompt):>6}  {arrived:>7}  {f'step {at_step}, {at_clock}':>17}  "
              f"{at_clock - arrived:>6}  {'MATCH' if ok else 'MISMATCH'}{where}")
    kv = sched.kv
    accounted = kv.allocator.num_free + kv.tree.total_pages == kv.num_pages and kv.tree.protected_pages == 0
    print(f"\npages: {kv.allocator.num_free} free + {kv.tree.total_pages} in the tree = {kv.num_pages}")
    ok = all_ok and accounted
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
