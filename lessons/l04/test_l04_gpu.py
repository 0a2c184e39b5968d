"""Lesson 4 on the GPU: the batching engine with FlashInfer, in bf16, against HF run alone.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l04
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import GPU_CHECKPOINT_KWARGS, HFReference, tiny_checkpoint, tolerant_parity

pytestmark = pytest.mark.gpu
LOGIT_GAP_TOLERANCE = 0.5  # DESIGN.md §5 rule; see lessons/l03/test_l03_gpu.py for how it was chosen


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_batched_bf16_parity_with_hf_alone(arch: str) -> None:
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    # a pool small enough that requests have to wait for each other
    llm = LLM(path, device="cuda", num_pages=40, page_size=16, max_running=16)
    assert type(llm.engine.backend).__name__ == "FlashInferBackend"
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    rng = random.Random(arch)
    prompts = [[rng.randrange(llm.config.vocab_size) for _ in range(rng.randint(1, 200))] for _ in range(24)]
    params = [SamplingParams(max_tokens=rng.randint(8, 48), ignore_eos=True) for _ in prompts]
    outs = llm.generate(prompts, params, progress=False)
    references = [hf.greedy_with_logits(prompt, p.max_tokens) for prompt, p in zip(prompts, params)]
    for prompt, out, (ref, logits) in zip(prompts, outs, references):
        report = tolerant_parity(out.token_ids, ref, logits, LOGIT_GAP_TOLERANCE)
        assert report.ok, f"{arch} prompt of {len(prompt)} tokens: {report}"
    # Teacher-forced through the batching engine: prompt + HF's first k tokens, one new token
    # each, all in one ragged batch; wherever HF was confident, the engine must agree.
    forced_prompts, expected = [], []
    for prompt, (ref, logits) in zip(prompts, references):
        for k in sorted({0, len(ref) // 3, 2 * len(ref) // 3, len(ref) - 1}):
            top2 = logits[k].topk(2).values
            if top2[0] - top2[1] >= LOGIT_GAP_TOLERANCE:
                forced_prompts.append(prompt + ref[:k])
                expected.append(ref[k])
    forced = llm.generate(forced_prompts, SamplingParams(max_tokens=1, ignore_eos=True), progress=False)
    assert [o.token_ids[0] for o in forced] == expected
    assert len(expected) >= 30, f"only {len(expected)} confident positions"
    assert llm.scheduler.kv.allocator.num_free == 40, "every page is returned"


def test_sampling_on_gpu_is_valid_and_seeded_runs_reproduce() -> None:
    llm = LLM(tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS), device="cuda", num_pages=64)
    prompts = [[5, 6, 7, 8]] * 8
    free = llm.generate(prompts, SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=24, ignore_eos=True), progress=False)
    assert all(0 <= t < llm.config.vocab_size for o in free for t in o.token_ids)
    assert len({tuple(o.token_ids) for o in free}) > 1, "unseeded sampling should differ between requests"
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    a = llm.generate([[5, 6, 7, 8]], seeded, progress=False)[0].token_ids
    b = llm.generate([[1, 2, 3], [5, 6, 7, 8], [9] * 40], [SamplingParams(max_tokens=5), seeded, SamplingParams(max_tokens=30)], progress=False)[1].token_ids
    assert a == b


def test_float32_checkpoint_runs_in_bf16_on_gpu() -> None:
    llm = LLM(tiny_checkpoint("qwen3", **{**GPU_CHECKPOINT_KWARGS, "dtype": "float32"}), device="cuda", num_pages=32)
    assert llm.dtype == torch.bfloat16 and type(llm.engine.backend).__name__ == "FlashInferBackend"
    out = llm.generate(["Hello"], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    assert len(out[0].token_ids) == 8
