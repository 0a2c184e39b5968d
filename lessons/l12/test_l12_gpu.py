"""Lesson 12 on a GPU: the verify path in bf16, both proposers.

Run on a machine with a CUDA GPU (and FlashInfer): pytest -m gpu lessons/l12

A verify row (a request's last token and its drafts) is a prefill-with-cache row for the
attention kernels, not a decode row, so on the GPU it runs other kernels than a plain step and
rounds differently. The tolerance rule of the other GPU tests applies: the speculative engine's
greedy tokens, free-running, equal HF's (bf16) until HF's first close call (top-2 logit gap
below the tolerance); and drafts are accepted, several at a time in some steps.
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import (
    GPU_CHECKPOINT_KWARGS,
    LOGIT_GAP_TOLERANCE,
    HFReference,
    draft_checkpoint,
    tiny_checkpoint,
    tolerant_parity,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_speculative_decoding_on_the_gpu_matches_hf_within_bf16_tolerance(proposer: str) -> None:
    path = tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS)
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    rng = random.Random(f"l12-gpu-{proposer}")
    prompts = []
    for i in range(8):  # half repeat a pattern (prompt lookup's food), half random
        pattern = [rng.randrange(8, 500) for _ in range(rng.randint(2, 6))]
        prompts.append(pattern * rng.randint(3, 8) if i % 2 == 0 else [rng.randrange(8, 500) for _ in range(40)])
    references = [hf.greedy_with_logits(prompt, 48) for prompt in prompts]
    settings = dict(speculative=proposer, num_speculative_tokens=4)
    if proposer == "draft":
        settings["draft_model"] = str(draft_checkpoint(path, noise=0.05))
    llm = LLM(path, device="cuda", num_pages=256, page_size=16, max_running=8, **settings)
    outs = llm.generate(prompts, SamplingParams(max_tokens=48, ignore_eos=True), progress=False)
    compared = 0
    for prompt, out, (ref, logits) in zip(prompts, outs, references):
        report = tolerant_parity(out.token_ids, ref, logits, LOGIT_GAP_TOLERANCE)
        assert report.ok, f"{proposer}, prompt of {len(prompt)} tokens: {report}"
        assert len(out.token_ids) == sum(a + 1 for a in out.spec_accepted)
        compared += report.compared
    accepted = [a for o in outs for a in o.spec_accepted]
    print(f"{proposer}: {compared} tokens compared, {sum(accepted)} drafts accepted in {len(accepted)} steps")
    assert compared >= 48 * len(prompts) // 4, f"too few positions compared ({compared})"
    assert sum(accepted) > 0 and any(a >= 2 for a in accepted), "drafts must be accepted, several at once"
    kv = llm.scheduler.kv
    assert kv.allocator.num_free + len(kv.tree.pages()) == kv.num_pages, "a page is still held"
    if proposer == "draft":
        draft = llm.scheduler.loop.proposer
        assert not draft.rows and draft.kv.allocator.num_free == draft.kv.num_pages, "draft KV still held"
