"""Lesson 3 smoke run: generation over the block-tensor KV pool with a paged attention backend, beside HF.

    python lessons/l03/smoke.py                          # CPU: TorchPagedBackend, float32, all three archs
    python lessons/l03/smoke.py --arch llama --page-size 1 --prompt "Once upon a time"
    python lessons/l03/smoke.py --device cuda            # FlashInfer, bf16, head_dim-128 tiny checkpoints
    python lessons/l03/smoke.py --device cuda --backend triton   # lesson 3's hand-written Triton decode kernel
    python lessons/l03/smoke.py --model /path/to/Qwen3-0.6B   # a real HF checkpoint directory
    python lessons/l03/smoke.py --mine                   # YOUR lessons/l03/exercise.py (--mine-file PATH: another file)

The backend is chosen automatically (``make_paged_backend(pool, num_heads)``): ``TorchPagedBackend``
(the reference with vectorised decode) on the CPU, FlashInfer on a CUDA device where it is installed
(``--backend`` overrides it). The CPU run must give
exactly HF's tokens. On CUDA both sides run in bf16, where two correct implementations may pick
different tokens wherever HF itself was nearly undecided (top-2 logit gap below a tolerance). So
the CUDA check is the GPU tests' rule: (1) free-running tokens must agree up to HF's first close
call (``tolerant_parity``), and (2) teacher-forced along HF's tokens, our argmax must equal HF's at
*every* position where HF was confident (``confident_disagreements``). The last line is MATCH or
MISMATCH (and the exit code is 1).
"""

from __future__ import annotations

import argparse
import sys

import torch

from minisgl.attention.factory import make_paged_backend
from minisgl.attention.paged import BlockSequence
from minisgl.generate import SequenceGenerator
from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.models import load_model
from minisgl.testing import (
    ARCHITECTURES,
    GPU_CHECKPOINT_KWARGS,
    LOGIT_GAP_TOLERANCE,
    HFReference,
    confident_disagreements,
    first_difference,
    teacher_forced_logits,
    tiny_checkpoint,
    tolerant_parity,
)
from minisgl.tokenizer import load_tokenizer
from minisgl.utils import cdiv

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l03/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(3)


def describe(meta) -> str:
    return (f"qo_indptr={meta.qo_indptr.tolist()} kv_indptr={meta.kv_indptr.tolist()} "
            f"kv_indices={meta.kv_indices.tolist()} kv_last_page_len={meta.kv_last_page_len.tolist()}")


def run_one(
    name: str, path, prompts: list[str], max_new_tokens: int, page_size: int, device: str, backend_kind: str
) -> bool:
    """Generate every prompt (one after another, over one pool) with minisgl and with HF; True if all agree."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = load_model(path, dtype=dtype, device=device)
    hf = HFReference(path, dtype=dtype, device=device)
    tokenizer = load_tokenizer(path)
    cfg = model.config
    prompt_ids = [tokenizer.encode(p) for p in prompts]
    # CPU: stop at EOS as a user would. CUDA: fixed length, so the logit-gap rule sees every step.
    stop_ids = cfg.eos_token_ids if device == "cpu" else ()

    num_pages = max(cdiv(len(ids) + max_new_tokens, page_size) for ids in prompt_ids) + 2
    pool = PagedKVPool.for_model(cfg, num_pages, page_size, dtype, device)
    allocator = BlockAllocator(num_pages)
    backend = make_paged_backend(pool, cfg.num_heads, backend_kind)
    print(f"=== {name}: {path}")
    print(f"backend     : {type(backend).__name__} on {device}, {dtype}; "
          f"{cfg.num_heads} query heads share {cfg.num_kv_heads} KV heads (group {cfg.num_heads // cfg.num_kv_heads})")
    print(f"pool        : {num_pages} pages x {page_size} tokens, per layer K and V "
          f"[{num_pages}, {page_size}, {cfg.num_kv_heads}, {cfg.head_dim}], {pool.nbytes:,} bytes")

    ok_all = True
    for prompt, ids in zip(prompts, prompt_ids):
        gen = SequenceGenerator(model, BlockSequence(pool, allocator, backend), ids, max_new_tokens, stop_ids)
        gen.step()
        print(f"--- {prompt!r} -> {len(ids)} tokens")
        print(f"prefill     : {describe(backend.meta)}")
        while not gen.finished:
            gen.step()
        print(f"last decode : {describe(backend.meta)}")
        ours = gen.output_ids
        if device == "cpu":
            theirs = hf.greedy(ids, max_new_tokens, stop_token_ids=stop_ids)
            ok = ours == theirs
            verdict = "identical" if ok else "differ"
        else:
            theirs, logits = hf.greedy_with_logits(ids, max_new_tokens)
            report = tolerant_parity(ours, theirs, logits, LOGIT_GAP_TOLERANCE)
            forced = teacher_forced_logits(model, BlockSequence(pool, allocator, backend), ids, theirs)
            n_confident, wrong = confident_disagreements(forced, logits, LOGIT_GAP_TOLERANCE)
            ok = report.ok and not wrong
            same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
            verdict = (f"first {same} identical; HF's first top-2 gap < {LOGIT_GAP_TOLERANCE} at "
                       f"{report.first_close_call}" + ("" if report.ok else f", but a mismatch at {report.first_mismatch}")
                       + f"; teacher-forced: {n_confident - len(wrong)}/{n_confident} confident positions agree")
        print(f"minisgl ids : {ours}")
        print(f"HF      ids : {theirs}")
        print(f"minisgl text: {tokenizer.decode(ours)!r}")
        print(f"HF      text: {tokenizer.decode(theirs)!r}")
        if device == "cpu" and not ok:
            first = first_difference(ours, theirs)
            verdict += f" (first difference at new token {first})"
        print(f"tokens      : {verdict} -> {'MATCH' if ok else 'MISMATCH'}")
        ok_all &= ok
    leaked = allocator.num_allocated
    print(f"pages back  : {allocator.num_free}/{allocator.num_blocks} free" + (f"  LEAK: {leaked} pages!" if leaked else ""))
    ok_all &= leaked == 0
    print(f"{name}: {'MATCH' if ok_all else 'MISMATCH'}\n")
    return ok_all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHITECTURES, help="one tiny architecture (default: all three)")
    parser.add_argument("--model", help="a real HF checkpoint directory (or hub id) instead of the tiny ones")
    parser.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--backend", choices=("auto", "reference", "torch", "flashinfer", "triton"), default="auto",
                        help="attention backend (default: FlashInfer on CUDA when installed, else the reference)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")

    prompts = args.prompt or ["The key and value vectors"]
    if args.model:
        runs = [("model", args.model)]
    else:
        archs = [args.arch] if args.arch else list(ARCHITECTURES)
        # On CUDA: bf16 and head_dim 128 (the shapes FlashInfer's precompiled kernels cover), and
        # smaller random weights than the CPU models so that bf16 rounding stays small (see README).
        extra = {} if args.device == "cpu" else GPU_CHECKPOINT_KWARGS
        runs = [(arch, tiny_checkpoint(arch, **extra)) for arch in archs]  # built offline, random weights
    results = [
        run_one(name, path, prompts, args.max_new_tokens, args.page_size, args.device, args.backend) for name, path in runs
    ]
    print("MATCH" if all(results) else "MISMATCH")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
