"""Lesson 5 on the GPU: the radix cache with FlashInfer, in bf16, against HF run alone.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l05
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


@pytest.mark.parametrize("num_pages", [400, 48], ids=["roomy", "tight"])
def test_shared_prefixes_bf16_parity_with_hf_alone(num_pages: int) -> None:
    """Groups of requests sharing a system prompt; in the tight pool the tree evicts and
    running requests are retracted. Every request must agree with HF under the gap rule."""
    path = tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS)
    llm = LLM(path, device="cuda", num_pages=num_pages, page_size=16, max_running=16)
    assert type(llm.engine.backend).__name__ == "FlashInferBackend"
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    rng = random.Random("l05-gpu")
    vocab = llm.config.vocab_size
    systems = [[rng.randrange(vocab) for _ in range(rng.randint(40, 120))] for _ in range(3)]
    prompts = [rng.choice(systems) + [rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(24)]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    references = [hf.greedy_with_logits(p, 32) for p in prompts]
    outs = llm.generate(prompts, params, progress=False)
    for prompt, out, (ref, logits) in zip(prompts, outs, references):
        report = tolerant_parity(out.token_ids, ref, logits, LOGIT_GAP_TOLERANCE)
        assert report.ok, f"prompt of {len(prompt)} tokens ({out.num_cached_tokens} cached): {report}"
    # Teacher-forced through the engine (cache hits, eviction and retraction included): our logits
    # equal HF's argmax at every confident position of every request.
    kv = llm.scheduler.kv
    hits_before = kv.stats.hit_tokens
    forcing = TeacherForcingSampler({tuple(p): ref for p, (ref, _) in zip(prompts, references)})
    llm.engine.sampler = forcing
    llm.generate(prompts, params, progress=False)
    confident = 0
    for prompt, (_ref, logits) in zip(prompts, references):
        n, wrong = confident_disagreements(forcing.logits(prompt), logits, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"prompt of {len(prompt)} tokens: confident positions {wrong} differ"
        confident += n
    assert kv.stats.hit_tokens > hits_before, "the second run must hit the cache too"
    compared = confident
    hits = [o.num_cached_tokens for o in outs]
    stats = llm.scheduler.kv.stats
    print(f"pages {num_pages}: {compared} of {len(prompts) * 32} positions confident and equal; hits {hits}; {stats}")
    assert compared >= len(prompts) * 32 // 4, "too few confident positions: the test lost its teeth"
    assert sum(h > 0 for h in hits) >= 12, hits
    if num_pages == 48:
        assert stats.evicted_pages > 0 and stats.retractions > 0
    kv = llm.scheduler.kv
    assert kv.allocator.num_free + kv.tree.total_pages == num_pages and kv.tree.protected_pages == 0
