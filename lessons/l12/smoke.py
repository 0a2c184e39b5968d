"""Lesson 12 smoke run: speculative decoding (n-gram or draft-model proposer), beside Hugging Face.

    python lessons/l12/smoke.py                     # tiny Llama (the tests' checkpoint, weight std 0.12), k = 4
    python lessons/l12/smoke.py --arch qwen3 --k 2  # another architecture, fewer drafts per step
    python lessons/l12/smoke.py --model demo        # the bundled demo model on a repetitive chat prompt
    python lessons/l12/smoke.py --model demo --proposer draft   # the demo's own draft model proposes
    python lessons/l12/smoke.py --proposer draft    # tiny Llama, drafts from a noisy copy of it
    python lessons/l12/smoke.py --mine              # YOUR lessons/l12/exercise.py (--mine-file PATH: another file)

Generates a few prompts in one batch with ``LLM(..., speculative="ngram",
num_speculative_tokens=k)`` (or ``speculative="draft"`` with the demo's draft, ``demo-draft``, for
the demo; for a tiny checkpoint the tests' draft, the same weights with a little noise) and
prints, for each, our tokens beside Hugging Face's greedy tokens for that prompt alone, and how
many tokens each step added (the prefill's one token, then each verify step's accepted drafts
plus the target's own token). Then the totals: decode
steps, tokens per decode step, and the share of drafted tokens the target accepted. The last
line is MATCH (every request identical) or MISMATCH (exit 1).
"""

from __future__ import annotations

import argparse
import sys

import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import TEST_PROMPTS, HFReference, draft_checkpoint, first_difference, tiny_checkpoint
from minisgl.tokenizer import encode_prompt, load_tokenizer

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l12/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(12)

SPEC_STD = 0.12  # the lesson's test models: at the other lessons' 0.3, greedy text almost never repeats
DEMO_CHAT = [{"role": "user", "content": "Say 'the cat sat on the mat' five times, one per line."}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="llama", help="tiny checkpoint architecture (qwen3, llama, qwen2)")
    parser.add_argument("--model", help="a checkpoint directory, hub id or 'demo' instead of the tiny one")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens: most drafts per request and step")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--proposer", choices=["ngram", "draft"], default="ngram")
    parser.add_argument("--draft-model", help="with --proposer draft: the draft (default: demo-draft for the demo, "
                        "else a noisy copy of the tiny checkpoint)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a tiny model's ops are too short to share between threads

    path = args.model or tiny_checkpoint(args.arch, std=SPEC_STD)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)  # HF's reference never stops early either
    proposer = {"speculative": args.proposer}
    if args.proposer == "draft":
        proposer["draft_model"] = args.draft_model or ("demo-draft" if args.model == "demo" else str(draft_checkpoint(path)))
    with LLM(path, num_speculative_tokens=args.k, max_running=4, page_size=4, **proposer) as llm:
        model_path = llm.model_path
        tok = load_tokenizer(model_path)
        prompts = [encode_prompt(tok, DEMO_CHAT)] if args.model == "demo" else [tok.encode(p) for p in TEST_PROMPTS]
        outs = llm.generate(prompts, params, progress=False)
    print(f"LLM(speculative={args.proposer!r}, num_speculative_tokens={args.k}): {len(prompts)} prompt(s) in one "
          "batch, each beside HF alone")
    hf = HFReference(model_path)
    ok = True
    steps = tokens = drafted = accepted = 0
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        theirs = hf.greedy(prompt, len(out.token_ids))
        same = out.token_ids == theirs
        ok &= same
        per_step = [a + 1 for a in out.spec_accepted]
        print(f"request {i} ({len(prompt)} prompt tokens, {len(out.token_ids)} new)")
        print(f"  minisgl: {out.token_ids}")
        print(f"  HF     : {theirs}")
        print(f"  tokens per step: {per_step}")
        print(f"  {'MATCH' if same else f'MISMATCH, first difference at new token {first_difference(out.token_ids, theirs)}'}")
        steps += len(per_step) - 1  # the first step is the prefill's one token
        tokens += sum(per_step) - 1
        drafted += sum(out.spec_drafted)
        accepted += sum(out.spec_accepted)
    if steps:
        print(f"decode steps: {steps}, tokens: {tokens}, tokens per decode step: {tokens / steps:.2f}; "
              f"drafts accepted: {accepted} of {drafted} ({accepted / max(drafted, 1):.0%})")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
