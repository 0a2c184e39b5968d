"""Lesson 8 smoke run: which decode steps go through the graph runner, in which bucket.

    python lessons/l08/smoke.py                       # tiny Qwen3, buckets [1, 2, 4, 5]
    python lessons/l08/smoke.py --max-bs 8            # another ladder: [1, 2, 4, 8]
    python lessons/l08/smoke.py --model /path/to/Qwen3-0.6B
    python lessons/l08/smoke.py --mine                # YOUR lessons/l08/exercise.py (--mine-file PATH: another file)

Seven requests arrive over the first steps and stop after different numbers of tokens, so the
decode batch grows and shrinks. Each line is one step: the rows of the batch (``r2:d`` a
decode row, ``r0:p12`` a prompt of 12 tokens) and where it ran. A decode batch of at most
``--max-bs`` rows runs through the runner in the smallest bucket that holds it, padded with
rows that live in the scratch page; on a GPU that is one graph replay, on the CPU the same
static buffers run eagerly. A prefill, or a decode batch larger than the largest bucket, runs
eagerly as in lesson 7. At the end every request is compared with Hugging Face's greedy tokens
for its prompt alone, and the KV pages are counted. The last line is MATCH or MISMATCH (exit 1).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from minisgl import LLM, SamplingParams
from minisgl.core import Batch, Req
from minisgl.testing import HFReference, first_difference, tiny_checkpoint

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l08/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(8)


def rows(batch: Batch) -> str:
    return " ".join(f"r{req.rid}:" + ("d" if dec else f"p{n}")
                    for req, n, dec in zip(batch.reqs, batch.extend_lens, batch.decode_rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint dir (default: the tiny Qwen3 test checkpoint)")
    parser.add_argument("--max-bs", type=int, default=5, help="cuda_graph_max_bs (the largest bucket)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    path = args.model or tiny_checkpoint("qwen3")
    llm = LLM(path, num_pages=96, page_size=4, max_running=8, max_seq_len=64, prefix_cache=False,
              cuda_graph_max_bs=args.max_bs)
    hf = HFReference(path, dtype=llm.dtype, device=llm.device)
    runner = llm.engine.runner
    rng = random.Random(8)
    vocab = llm.config.vocab_size
    prompts = [[rng.randrange(8, vocab) for _ in range(rng.randint(3, 12))] for _ in range(7)]
    arrivals = [0, 0, 1, 2, 2, 3, 3]  # step() call at which each request is added
    max_tokens = [9, 4, 10, 3, 8, 6, 7]
    references = [hf.greedy(p, n) for p, n in zip(prompts, max_tokens)]

    sched = llm.scheduler
    log: list[str] = []
    real_launch = sched.engine.launch

    def launch(batch: Batch):
        replays, eager = sum(runner.stats.replays.values()), runner.stats.eager_decodes
        chosen = runner.bucket_for(batch.size) if runner.can_run(batch) else None
        handle = real_launch(batch)
        if sum(runner.stats.replays.values()) > replays:
            padded = chosen - batch.size
            where = f"runner, bucket {chosen}" + (f" ({padded} padded row{'s' * (padded > 1)} in page "
                                                  f"{runner.scratch_page})" if padded else "")
        elif runner.stats.eager_decodes > eager:
            where = f"eager: {batch.size} decode rows, more than the largest bucket ({runner.buckets[-1]})"
        else:
            where = "eager: has prompt tokens (prefill or mixed)"
        log.append(f"[{rows(batch)}] -> {where}")
        return handle

    sched.engine.launch = launch
    capture = 'graphs captured' if runner.capture_graphs else 'no capture on the CPU: the runner runs its buffers eagerly'
    print(f"model: {path}\ndevice: {llm.device} ({capture})"
          f"\nbuckets: {runner.buckets}\n")
    reqs: list[Req] = []
    call = 0
    while len(reqs) < len(prompts) or sched.has_work:
        while len(reqs) < len(prompts) and arrivals[len(reqs)] <= call:
            n = len(reqs)
            reqs.append(sched.add_request(prompts[n], SamplingParams(max_tokens=max_tokens[n], ignore_eos=True)))
        sched.step() if sched.has_work else sched.flush()
        print(f"step {call:>2}: " + ("; ".join(log) or "no launch (the last batch's tokens processed)"))
        log.clear()
        call += 1

    print(f"\nrunner: {runner.stats}")
    ok = True
    for req, ref in zip(reqs, references):
        same = req.output_ids == ref
        ok &= same
        where = "" if same else f"  first difference at token {first_difference(req.output_ids, ref)}"
        print(f"r{req.rid}: {len(req.output_ids)} tokens  {'MATCH' if same else 'MISMATCH'}{where}")
    kv = sched.kv
    back = kv.allocator.num_free == kv.num_pages
    print(f"\npages: {kv.allocator.num_free} of {kv.num_pages} free after the run")
    ok &= back
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
