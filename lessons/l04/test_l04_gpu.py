"""Lesson 4 on the GPU: the batching engine with FlashInfer, in bf16, against HF run alone.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l04
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
    tolerant_parity,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_batched_bf16_parity_with_hf_alone(arch: str) -> None:
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    # a pool small enough that requests have to wait for each other
    llm = LLM(path, device="cuda", num_pages=40, page_size=16, max_running=16,
              prefix_cache=False)
    assert type(llm.engine.backend).__name__ == "FlashInferBackend"
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    rng = random.Random(arch)
    prompts = [[rng.randrange(llm.config.vocab_size) for _ in range(rng.randint(1, 200))] for _ in range(24)]
    params = [SamplingParams(max_tokens=rng.randint(8, 48), ignore_eos=True) for _ in prompts]
    references = [hf.greedy_with_logits(prompt, p.max_tokens) for prompt, p in zip(prompts, params)]

    # Free-running: equal to HF until HF's first close call. In bf16 that comes early (see the
    # printed count), which is why the teacher-forced check below carries the weight.
    outs = llm.generate(prompts, params, progress=False)
    compared = 0
    for prompt, out, (ref, logits) in zip(prompts, outs, references):
        report = tolerant_parity(out.token_ids, ref, logits, LOGIT_GAP_TOLERANCE)
        assert report.ok, f"{arch} prompt of {len(prompt)} tokens: {report}"
        compared += report.compared
    total = sum(p.max_tokens for p in params)
    print(f"{arch}: free-running parity compared {compared} of {total} tokens")

    # Teacher-forced through the batching engine: the sampler feeds every request HF's tokens,
    # so every batched prefill and decode step runs on HF's sequence and our logits are compared
    # at every position where HF is confident (top-2 gap >= tolerance), all the way to the end.
    forcing = TeacherForcingSampler({tuple(p): ref for p, (ref, _) in zip(prompts, references)})
    llm.engine.sampler = forcing
    llm.generate(prompts, params, progress=False)
    confident = decode_confident = 0
    for prompt, (_ref, logits) in zip(prompts, references):
        n, wrong = confident_disagreements(forcing.logits(prompt), logits, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"{arch} prompt of {len(prompt)} tokens: confident positions {wrong} differ"
        confident += n
        decode_confident += n - int(logits[0].float().topk(2).values.diff().abs() >= LOGIT_GAP_TOLERANCE)
    print(f"{arch}: teacher-forced: {confident} of {total} positions confident and equal, {decode_confident} from decode steps")
    assert confident >= total // 4 and decode_confident >= 100, "too few confident positions: the test lost its teeth"
    assert llm.scheduler.kv.allocator.num_free == 40, "every page is returned"


def test_sampling_on_gpu_is_valid_and_seeded_runs_reproduce() -> None:
    llm = LLM(tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS), device="cuda", num_pages=64, prefix_cache=False)
    prompts = [[5, 6, 7, 8]] * 8
    free = llm.generate(prompts, SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=24, ignore_eos=True),
                        progress=False)
    assert all(0 <= t < llm.config.vocab_size for o in free for t in o.token_ids)
    assert len({tuple(o.token_ids) for o in free}) > 1, "unseeded sampling should differ between requests"
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    a = llm.generate([[5, 6, 7, 8]], seeded, progress=False)[0].token_ids
    b = llm.generate([[1, 2, 3], [5, 6, 7, 8], [9] * 40], [SamplingParams(max_tokens=5), seeded, SamplingParams(max_tokens=30)],
                     progress=False)[1].token_ids
    assert a == b


def test_float32_checkpoint_runs_in_bf16_on_gpu() -> None:
    llm = LLM(tiny_checkpoint("qwen3", **{**GPU_CHECKPOINT_KWARGS, "dtype": "float32"}), device="cuda", num_pages=32,
              prefix_cache=False)
    assert llm.dtype == torch.bfloat16 and type(llm.engine.backend).__name__ == "FlashInferBackend"
    out = llm.generate(["Hello"], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    assert len(out[0].token_ids) == 8


def test_failure_mid_forward_on_gpu_leaves_the_engine_correct(monkeypatch) -> None:
    """A kernel-level failure in the middle of a decode forward (after FlashInfer was planned and
    some layers ran): the batch fails, its pages come back, and the next run still matches."""
    from minisgl.llm import RequestFailedError

    path = tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS)
    llm = LLM(path, device="cuda", num_pages=40, page_size=16, max_running=16,
              prefix_cache=False, cuda_graph_max_bs=0)  # eager decode (lesson 8 tests the graph path)
    prompts = [[5, 6, 7, 8] * 10, [9, 10, 11]]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    clean = [o.token_ids for o in llm.generate(prompts, params, progress=False)]
    forward = llm.engine.backend.forward
    calls = {"n": 0}

    def failing_forward(q, k, v, layer_id):
        calls["n"] += 1
        if calls["n"] == 3 * llm.config.num_layers + 1:  # prefill, two decode steps, then layer 0 fails
            raise RuntimeError("injected kernel failure")
        return forward(q, k, v, layer_id)

    monkeypatch.setattr(llm.engine.backend, "forward", failing_forward)
    with pytest.raises(RequestFailedError, match="injected kernel failure"):
        llm.generate(prompts, params, progress=False)
    monkeypatch.undo()
    assert llm.scheduler.kv.allocator.num_free == 40 and not llm.scheduler.running
    assert [o.token_ids for o in llm.generate(prompts, params, progress=False)] == clean
