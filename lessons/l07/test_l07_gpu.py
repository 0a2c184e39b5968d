"""Lesson 7 on the GPU: overlap scheduling with FlashInfer, in bf16.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l07

On the GPU the race conditions are real: batch N+1 is planned (FlashInfer plans, pinned
staging) while batch N still runs. A plan or a staging buffer reused too early hands a step
another step's indices, and its logits are garbage. In bf16 the overlapped and synchronous
loops may legitimately differ at near ties (a request leaves one step later with overlap, so
batches are composed differently and bf16 sums round differently), so each run is compared
with HF under the top-2 logit-gap rule, with HF's tokens fed back (teacher forcing): every
confident position must agree, at every step of every request.
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


def forced_parity(arch: str, prompts: list[list[int]], max_tokens: list[int], **kw) -> int:
    """Run ``prompts`` with overlap on, HF's tokens fed back; assert every confident position
    agrees with HF; return how many positions were confident."""
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    llm = LLM(path, device="cuda", overlap=True, **kw)
    assert type(llm.engine.backend).__name__ == "FlashInferBackend"
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    references = [hf.greedy_with_logits(p, n) for p, n in zip(prompts, max_tokens)]
    forcing = TeacherForcingSampler({tuple(p): ref for p, (ref, _) in zip(prompts, references)})
    llm.engine.sampler = forcing
    in_flight = []
    launch = llm.engine.launch
    llm.engine.launch = lambda batch: in_flight.append(len(llm.scheduler.loop.in_flight)) or launch(batch)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    llm.generate(prompts, params, progress=False)
    assert max(in_flight) == 1, "batch N+1 must be launched while batch N is in flight"
    confident = 0
    for prompt, (_ref, logits) in zip(prompts, references):
        n, wrong = confident_disagreements(forcing.logits(prompt), logits, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"{arch}: prompt of {len(prompt)} tokens: confident positions {wrong} differ"
        confident += n
    sched = llm.scheduler
    assert not sched.loop.in_flight and not sched.running
    assert sched.kv.allocator.num_free + sched.kv.tree.total_pages == sched.kv.num_pages, "pages leaked"
    return confident


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_overlap_bf16_teacher_forced_parity(arch: str) -> None:
    rng = random.Random(arch)
    prompts = [[rng.randrange(8, 500) for _ in range(rng.randint(1, 200))] for _ in range(24)]
    max_tokens = [rng.randint(1, 40) for _ in prompts]
    confident = forced_parity(arch, prompts, max_tokens, num_pages=400, page_size=16, max_running=8,
                              chunked_prefill_size=64)
    assert confident >= sum(max_tokens) // 4


def test_stress_many_small_steps_of_changing_shape() -> None:
    """Hundreds of steps whose batch shapes change every step (joins, leaves, chunks of 3
    tokens, a tight pool with retraction), each planned while the previous one runs."""
    rng = random.Random("stress")
    prompts = [[rng.randrange(8, 500) for _ in range(rng.randint(1, 90))] for _ in range(48)]
    max_tokens = [rng.randint(1, 30) for _ in prompts]
    confident = forced_parity("llama", prompts, max_tokens, num_pages=40, page_size=16, max_running=12,
                              chunked_prefill_size=3)
    assert confident >= sum(max_tokens) // 4
