"""Lesson 10 on the GPU: the server on CUDA (bf16, FlashInfer, CUDA graphs), through HTTP.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l10

Greedy answers fetched over HTTP, 16 requests at once, are checked against HF in bf16 with the
tolerance rule of the other GPU tests (equal until HF's first close call); dropped streams free
their KV; the bundled demo model answers on the GPU.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
import torch

from minisgl.testing import GPU_CHECKPOINT_KWARGS, LOGIT_GAP_TOLERANCE, HFReference, tiny_checkpoint, tolerant_parity
from minisgl.testing.server import ServerProcess, wait_until_idle

pytestmark = pytest.mark.gpu


async def _completions(url: str, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    async def one(client: httpx.AsyncClient, prompt: list[int], n: int) -> list[int]:
        r = await client.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
        r.raise_for_status()
        return r.json()["output_ids"]

    async with httpx.AsyncClient(timeout=120) as client:
        return list(await asyncio.gather(*(one(client, p, n) for p, n in zip(prompts, max_tokens))))


def _workload(seed: int, n: int):
    """The GPU test checkpoint, ``n`` random prompts with their max_tokens, and HF's bf16
    greedy tokens and logits for each prompt alone."""
    path = tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS)
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    rng = random.Random(seed)
    prompts = [[rng.randrange(500) for _ in range(rng.randint(1, 300))] for _ in range(n)]
    max_tokens = [rng.randint(8, 40) for _ in prompts]
    return path, prompts, max_tokens, [hf.greedy_with_logits(p, m) for p, m in zip(prompts, max_tokens)]


def _check(url: str, prompts, max_tokens, references) -> None:
    """Everything through HTTP at once; each answer equal to HF's until its first close call."""
    outs = asyncio.run(_completions(url, prompts, max_tokens))
    compared = 0
    for prompt, out, (ref, logits) in zip(prompts, outs, references):
        report = tolerant_parity(out, ref, logits, LOGIT_GAP_TOLERANCE)
        assert report.ok, f"prompt of {len(prompt)} tokens: {report}"
        compared += report.compared
    print(f"HTTP on CUDA: free-running parity compared {compared} of {sum(max_tokens)} tokens")
    wait_until_idle(url)


def test_server_on_gpu_matches_hf_within_bf16_tolerance():
    path, prompts, max_tokens, references = _workload(10, 16)
    with ServerProcess(path, device="cuda", start_timeout=600) as server:
        _check(server.url, prompts, max_tokens, references)


def test_demo_model_answers_on_gpu():
    from minisgl.demo import demo_model_path
    from tests.demo_training.card import complete_words, word_list

    with ServerProcess(None, device="cuda", start_timeout=600) as server:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "What is a KV cache?"}], "temperature": 0, "max_tokens": 48})
        r.raise_for_status()
        text = r.json()["choices"][0]["message"]["content"]
        print(f"demo on CUDA: {text!r}")
        words = complete_words(text)
        assert len(words) >= 5 and all(w in word_list(demo_model_path()) for w in words), text


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensor_parallel_server_on_two_gpus():
    """``--tp-size 2`` on two GPUs (NCCL): HTTP answers within bf16 tolerance of HF, and dropped
    streams free their KV on both ranks."""
    path, prompts, max_tokens, references = _workload(11, 8)
    with ServerProcess(path, "--tp-size", "2", device="cuda", start_timeout=600, stop_timeout=10) as server:
        _check(server.url, prompts, max_tokens, references)
