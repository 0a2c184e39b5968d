"""Lesson 7 smoke run: the overlap loop, one ``Scheduler.step()`` call per line.

    python lessons/l07/smoke.py                     # tiny Qwen3, overlap on
    python lessons/l07/smoke.py --no-overlap        # the synchronous loop, for comparison
    python lessons/l07/smoke.py --model /path/to/Qwen3-0.6B
    python lessons/l07/smoke.py --mine              # YOUR lessons/l07/exercise.py (--mine-file PATH: another file)

Each call of ``step()`` prints what it launched (batch number and rows: ``r2:d`` a decode row,
``r0:p12`` a prompt of 12 tokens) and what it processed: the tokens the host learned, a token
dropped because its request had already finished, and the requests whose KV was freed. With
overlap on, a call launches batch N+1 *before* it processes batch N, so the host learns each
token one call later, and a request that stops at batch N still has a row in batch N+1.

Request r1 stops on a stop token (its third token, read from Hugging Face's output), r3 on
``max_tokens``; r2 and r3 arrive while others decode. At the end every request is compared with
Hugging Face's greedy tokens for its prompt alone, and the KV pages are counted. The last line
is MATCH (all identical, every page back, each finished request freed exactly once) or MISMATCH
(exit code 1).
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from minisgl import LLM, SamplingParams
from minisgl.core import Batch, Req, ReqStatus
from minisgl.testing import HFReference, first_difference, tiny_checkpoint

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l07/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(7)


def rows(batch: Batch) -> str:
    return " ".join(f"r{req.rid}:" + ("d" if dec else f"p{n}")
                    for req, n, dec in zip(batch.reqs, batch.extend_lens, batch.decode_rows))


def expected(reference: list[int], params: SamplingParams) -> list[int]:
    """HF's greedy tokens cut where the request must stop: its first stop token, or ``max_tokens``."""
    out: list[int] = []
    for tok in reference[: params.max_tokens]:
        out.append(tok)
        if tok in params.stop_token_ids:
            break
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint dir (default: the tiny Qwen3 test checkpoint)")
    parser.add_argument("--no-overlap", action="store_true", help="the synchronous loop (lesson 4)")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)

    path = args.model or tiny_checkpoint("qwen3")
    llm = LLM(path, num_pages=64, page_size=4, max_running=4, max_seq_len=64, overlap=not args.no_overlap,
              prefix_cache=False)
    hf = HFReference(path, dtype=llm.dtype, device=llm.device)
    rng = random.Random(7)
    vocab = llm.config.vocab_size
    prompts = [[rng.randrange(8, vocab) for _ in range(n)] for n in (12, 7, 9, 5)]
    arrivals = [0, 0, 2, 3]  # step() call at which each request is added
    references = [hf.greedy(p, args.max_tokens) for p in prompts]
    params = [SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)] * 4
    params[1] = SamplingParams(max_tokens=args.max_tokens, stop_token_ids=[references[1][2]], ignore_eos=True)
    params[3] = SamplingParams(max_tokens=3, ignore_eos=True)

    sched = llm.scheduler
    launched: list[Batch] = []  # every launched batch, numbered by its index
    log: list[str] = []
    frees: dict[int, int] = {}
    run_name = "step" if args.no_overlap else "launch"  # lesson 4's engine runs a batch with step()
    real_launch, real_process, real_release = getattr(sched.engine, run_name), sched.process, sched.kv.release_request

    def launch(batch: Batch):
        launched.append(batch)
        log.append(f"launch #{len(launched) - 1} [{rows(batch)}]")
        return real_launch(batch)

    def process(batch: Batch, tokens: list[int]) -> list[Req]:
        done_before = {r.rid for r in batch.reqs if r.status == ReqStatus.FINISHED}
        got = iter(tokens)
        learned = []
        for req, samples in zip(batch.reqs, batch.samples):
            if samples:
                tok = next(got)
                learned.append(f"r{req.rid}={tok}" + (" (dropped: finished)" if req.rid in done_before else ""))
        number = next(i for i, b in enumerate(launched) if b is batch)
        log.append(f"process #{number}: {', '.join(learned) or 'no token'}")
        return real_process(batch, tokens)

    def release(req: Req, cache: bool = True) -> None:
        if req.table_row >= 0 and req.status == ReqStatus.FINISHED:
            frees[req.rid] = frees.get(req.rid, 0) + 1
            log.append(f"free r{req.rid} ({sched.kv.page_table.pages_in_row(req.table_row)} pages)")
        real_release(req, cache=cache)

    setattr(sched.engine, run_name, launch)
    sched.process, sched.kv.release_request = process, release

    print(f"model: {path}\noverlap: {'off' if args.no_overlap else 'on'}\n")
    reqs: list[Req] = []
    call = 0
    while len(reqs) < len(prompts) or sched.has_work:
        while len(reqs) < len(prompts) and arrivals[len(reqs)] <= call:
            reqs.append(sched.add_request(prompts[len(reqs)], params[len(reqs)]))
            log.append(f"add r{reqs[-1].rid}")
        finished = sched.step() if sched.has_work else sched.flush()
        log += [f"r{r.rid} finished ({r.finish_reason})" for r in finished]
        print(f"step() call {call:>2}: " + "; ".join(log))
        log.clear()
        call += 1

    print(f"\n{'req':>4}  {'tokens':>6}  {'finish':>7}  {'freed':>5}  result")
    ok = True
    for req, ref, p in zip(reqs, references, params):
        theirs = expected(ref, p)
        same = req.output_ids == theirs and frees.get(req.rid) == 1
        ok &= same
        where = "" if req.output_ids == theirs else f"  first difference at token {first_difference(req.output_ids, theirs)}"
        print(f"{'r' + str(req.rid):>4}  {len(req.output_ids):>6}  {req.finish_reason:>7}  {frees.get(req.rid, 0):>4}x"
              f"  {'MATCH' if same else 'MISMATCH'}{where}")
    kv = sched.kv
    back = kv.allocator.num_free == kv.num_pages
    print(f"\npages: {kv.allocator.num_free} of {kv.num_pages} free after the run")
    ok &= back
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
