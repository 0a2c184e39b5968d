"""Lesson 8 on the GPU: captured decode steps (CUDA graphs) with FlashInfer, in bf16.

Run on a CUDA machine with FlashInfer: pytest -m gpu lessons/l08

A graph replays exactly what was captured, so a wrong static buffer, a padded row in a real
page or a stale plan shows up as wrong logits. Each test runs the same requests with graphs on
and off, HF's tokens fed back (teacher forcing), and compares the logits of every step: every
position where either side is confident (top-2 logit gap above the tolerance) must pick the
same token, and both must agree with HF there.
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


def forced_logits(llm: LLM, prompts: list[list[int]], references: list[list[int]], max_tokens: list[int]):
    forcing = TeacherForcingSampler({tuple(p): ref for p, ref in zip(prompts, references)})
    llm.engine.sampler = forcing
    llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens], progress=False)
    sched = llm.scheduler
    assert sched.kv.allocator.num_free + sched.kv.tree.total_pages == sched.kv.num_pages, "pages leaked"
    return [forcing.logits(p) for p in prompts]


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_graphs_match_eager_and_hf_in_bf16(arch: str) -> None:
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    rng = random.Random(f"l08-gpu-{arch}")
    # 21 requests arriving together: decode batches of 21, then fewer as they finish (buckets
    # 16 (max), 8, 4, 2, 1 and padded sizes in between); and a batch larger than the maximum.
    prompts = [[rng.randrange(8, 500) for _ in range(rng.randint(1, 120))] for _ in range(21)]
    max_tokens = [rng.randint(1, 48) for _ in prompts]
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    references = [hf.greedy_with_logits(p, n) for p, n in zip(prompts, max_tokens)]
    kw = dict(device="cuda", num_pages=600, page_size=16, max_running=24)
    graphs = LLM(path, cuda_graph_max_bs=16, **kw)
    runner = graphs.engine.runner
    attention = runner.slots[0].attention
    assert type(attention).__name__ == "FusedDecodeGraphAttention", "FlashInfer, and one kernel for small buckets"
    assert all(set(slot.graphs) == {(b, v) for b in runner.buckets for v in attention.variants(b)}
               for slot in runner.slots), "every bucket captured, small ones twice"
    assert graphs.graph_memory_bytes > 0
    ours = forced_logits(graphs, prompts, [r for r, _ in references], max_tokens)
    assert len(runner.stats.replays) >= 3 and runner.stats.eager_decodes > 0, runner.stats
    eager = forced_logits(LLM(path, cuda_graph_max_bs=0, **kw), prompts, [r for r, _ in references], max_tokens)
    confident = 0
    for _prompt, (_, hf_logits), g, e in zip(prompts, references, ours, eager):
        n, wrong = confident_disagreements(g, e, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"{arch}: graph and eager differ at confident positions {wrong}"
        n_hf, wrong_hf = confident_disagreements(g, hf_logits, LOGIT_GAP_TOLERANCE)
        assert wrong_hf == [], f"{arch}: graph and HF differ at confident positions {wrong_hf}"
        confident += n
    assert confident >= sum(max_tokens) // 4


def test_padded_rows_never_write_a_real_page() -> None:
    """After a run in which every batch of 3 was padded to 4, every page that no request owns
    and the tree does not hold is untouched, and the scratch page is the one that was written."""
    path = tiny_checkpoint("llama", **GPU_CHECKPOINT_KWARGS)
    llm = LLM(path, device="cuda", num_pages=64, page_size=16, max_running=4, cuda_graph_max_bs=4,
              prefix_cache=False)
    for layer in range(llm.config.num_layers):
        llm.pool.k[layer].fill_(7.0)
    rng = random.Random("pad")
    prompts = [[rng.randrange(8, 500) for _ in range(20)] for _ in range(3)]
    llm.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True), progress=False)
    assert llm.engine.runner.stats.replays.get(4, 0) > 0
    free = llm.scheduler.kv.allocator.num_free
    assert free == llm.pool.num_pages
    k = llm.pool.k[0]
    used_by_requests = 3 * -(-(20 + 30) // 16)  # each request reserves pages for its whole life
    untouched = int((k[: llm.pool.num_pages] == 7.0).all(dim=(1, 2, 3)).sum())
    assert untouched >= llm.pool.num_pages - used_by_requests
    assert not bool((k[llm.pool.scratch_page] == 7.0).all()), "padded rows write into the scratch page"


def test_a_failure_before_a_replay_fails_its_requests_alone(monkeypatch) -> None:
    """A decode step that fails in the runner after the slot was taken and before its graph was
    replayed: the batch fails with the message, every page comes back, and the graphs go on
    replaying correctly (same tokens as before the failure)."""
    from minisgl.llm import RequestFailedError

    path = tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS)
    llm = LLM(path, device="cuda", num_pages=64, page_size=16, max_running=8, cuda_graph_max_bs=8, prefix_cache=False)
    runner = llm.engine.runner
    prompts = [[5, 6, 7, 8] * 10, [9, 10, 11], [12] * 30]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    clean = [o.token_ids for o in llm.generate(prompts, params, progress=False)]
    attention = runner.slots[1].attention
    prepare, calls = attention.prepare, {"n": 0}

    def failing_prepare(meta):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure before replay")
        return prepare(meta)

    monkeypatch.setattr(attention, "prepare", failing_prepare)
    with pytest.raises(RequestFailedError, match="injected failure before replay"):
        llm.generate(prompts, params, progress=False)
    monkeypatch.undo()
    assert llm.scheduler.kv.allocator.num_free == 64 and not llm.scheduler.running
    replays = sum(runner.stats.replays.values())
    assert [o.token_ids for o in llm.generate(prompts, params, progress=False)] == clean
    assert sum(runner.stats.replays.values()) > replays
