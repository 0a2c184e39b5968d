"""Lesson 9 on GPUs: tensor parallelism over NCCL, two ranks on two GPUs, in bf16.

Run on a machine with two CUDA GPUs and FlashInfer: pytest -m gpu lessons/l09

Each rank runs FlashInfer attention over its own heads, CUDA graphs (the all-reduces are
captured with the rest of the decode step), overlap and the radix cache, all on by default.
Greedy tokens are compared with HF in bf16 on one GPU under the top-2 logit-gap rule: they must
agree up to the first position where HF itself is not confident.
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import GPU_CHECKPOINT_KWARGS, LOGIT_GAP_TOLERANCE, HFReference, tiny_checkpoint, tolerant_parity

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_nccl_tp2_matches_hf_in_bf16(arch: str) -> None:
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    rng = random.Random(f"l09-gpu-{arch}")
    prompts = [[rng.randrange(8, 500) for _ in range(rng.randint(1, 100))] for _ in range(12)]
    max_tokens = [rng.randint(4, 40) for _ in prompts]
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    references = [hf.greedy_with_logits(p, n) for p, n in zip(prompts, max_tokens)]
    with LLM(path, device="cuda", tp_size=2, num_pages=400, max_running=8, cuda_graph_max_bs=8) as llm:
        outs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens],
                            progress=False)
    checked = 0
    for out, (ref, logits) in zip(outs, references):
        report = tolerant_parity(out.token_ids, ref, logits, LOGIT_GAP_TOLERANCE)
        assert report.ok, f"{arch}: TP=2 differs from HF at confident position {report.first_mismatch}"
        checked += report.compared
    assert checked >= sum(max_tokens) // 4, f"too few confident positions compared ({checked})"
