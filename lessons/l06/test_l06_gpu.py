"""Lesson 6 on the GPU: mixed batches (decode tokens and prompt chunks) through FlashInfer, in bf16.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l06
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
    TeacherForcingSampler,
    confident_disagreements,
    tiny_checkpoint,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("budget", [7, 64])
def test_chunked_prefill_bf16_teacher_forced_parity(budget: int) -> None:
    """Prompts of up to 300 tokens split into chunks of ``budget`` tokens, mixed with decode
    tokens of other requests; HF's tokens fed back; our logits agree at every confident position."""
    path = tiny_checkpoint("llama", **GPU_CHECKPOINT_KWARGS)
    llm = LLM(path, device="cuda", num_pages=200, page_size=16, max_running=16, chunked_prefill_size=budget)
    assert type(llm.engine.backend).__name__ == "FlashInferBackend"
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    rng = random.Random(budget)
    prompts = [[rng.randrange(llm.config.vocab_size) for _ in range(rng.randint(1, 300))] for _ in range(16)]
    references = [hf.greedy_with_logits(p, 24) for p in prompts]
    modes: list[str] = []
    schedule = llm.scheduler.schedule
    llm.scheduler.schedule = lambda: (lambda b: (b is not None and modes.append(b.mode)) or b)(schedule())
    forcing = TeacherForcingSampler({tuple(p): ref for p, (ref, _) in zip(prompts, references)})
    llm.engine.sampler = forcing
    llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), progress=False)
    confident = 0
    for prompt, (_ref, logits) in zip(prompts, references):
        n, wrong = confident_disagreements(forcing.logits(prompt), logits, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"prompt of {len(prompt)} tokens: confident positions {wrong} differ"
        confident += n
    print(f"budget {budget}: {confident} of {16 * 24} positions confident and equal; modes {sorted(set(modes))}")
    assert "mixed" in modes and confident >= 16 * 24 // 4
