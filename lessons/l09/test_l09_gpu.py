"""Lesson 9 on GPUs: tensor parallelism over NCCL, two ranks on two GPUs, in bf16.

Run on a machine with two CUDA GPUs and FlashInfer: pytest -m gpu lessons/l09

Each rank runs FlashInfer attention over its own heads, CUDA graphs (the all-reduces are
captured with the rest of the decode step), overlap and the radix cache, all on by default.
As in lessons 7 and 8, HF's tokens are fed back (teacher forcing, installed in every rank by
``rank_init``: :func:`minisgl.testing.parity.force_reference_tokens`), so every position is
compared: wherever HF is confident (top-2 logit gap above the tolerance) the two ranks together
must pick HF's token.
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.testing import GPU_CHECKPOINT_KWARGS, LOGIT_GAP_TOLERANCE, HFReference, confident_disagreements, tiny_checkpoint
from minisgl.testing.parity import FORCED_ENV

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]
MODULE = os.path.splitext(os.path.basename(__file__))[0]


@pytest.fixture(autouse=True)
def importable_from_the_ranks(monkeypatch) -> None:
    monkeypatch.syspath_prepend(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_nccl_tp2_matches_hf_in_bf16(arch: str, tmp_path, monkeypatch) -> None:
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    rng = random.Random(f"l09-gpu-{arch}")
    prompts = [[rng.randrange(8, 500) for _ in range(rng.randint(1, 100))] for _ in range(12)]
    max_tokens = [rng.randint(4, 40) for _ in prompts]
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    references = [hf.greedy_with_logits(p, n) for p, n in zip(prompts, max_tokens)]
    spec = tmp_path / "forced.json"
    out = tmp_path / "logits.pt"
    spec.write_text(json.dumps({"prompts": prompts, "tokens": [r for r, _ in references], "out": str(out)}))
    monkeypatch.setenv(FORCED_ENV, str(spec))
    with LLM(path, device="cuda", tp_size=2, num_pages=400, max_running=8, cuda_graph_max_bs=8,
             rank_init="minisgl.testing.parity:force_reference_tokens") as llm:
        outs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens],
                            progress=False)
    assert [o.token_ids for o in outs] == [r for r, _ in references], "teacher forcing feeds HF's tokens"
    ours = torch.load(out)
    confident = 0
    for logits, (_, hf_logits) in zip(ours, references):
        n, wrong = confident_disagreements(logits, hf_logits, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"{arch}: TP=2 differs from HF at confident positions {wrong}"
        confident += n
    assert confident >= sum(max_tokens) // 4, f"too few confident positions ({confident})"


def symmetric_against_nccl_rank(settings: dict, rank: int, size: int):
    """A RankProcesses worker: the symmetric-memory all-reduce against NCCL's, eager and replayed
    from a CUDA graph, on each rank's own random numbers."""
    import torch.distributed as dist

    from minisgl.distributed.symmetric import SymmetricAllReduce

    device = settings["device"]
    symmetric = SymmetricAllReduce(device)

    def handle(command: dict) -> dict:
        report = []
        for dtype in (torch.bfloat16, torch.float32):
            for shape in ([1, 64], [3, 1000], [256, 4096]):
                generator = torch.Generator(device=device).manual_seed(1000 * rank + shape[0])
                x = torch.randn(shape, dtype=dtype, device=device, generator=generator)
                want = x.clone()
                dist.all_reduce(want)
                eager = symmetric.all_reduce(x.clone())
                static = torch.zeros_like(x)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    symmetric.all_reduce(static)
                static.copy_(x)  # new input after the capture, as a decode step's
                graph.replay()
                torch.cuda.synchronize()
                report.append({"case": f"{dtype} {shape}", "eager_equal": torch.equal(eager, want),
                               "graph_equal": torch.equal(static, want), "fits": symmetric.fits(x)})
        return {"report": report}

    return handle, {}


def rank_reports(worker: str) -> list[dict]:
    """Every row of the reports of two ranks running ``worker`` (a function of this module) on the GPUs."""
    from minisgl.distributed.launcher import RankProcesses

    ranks = RankProcesses(2, f"{MODULE}:{worker}", {"device": "cuda"})
    try:
        replies = ranks.call({"cmd": "check"})
    finally:
        ranks.close()
    return [row for reply in replies for row in reply["report"]]


def test_symmetric_memory_all_reduce_equals_nccl() -> None:
    for row in rank_reports("symmetric_against_nccl_rank"):
        assert row["fits"] and row["eager_equal"] and row["graph_equal"], row


def fused_add_norm_rank(settings: dict, rank: int, size: int):
    """A RankProcesses worker: lesson 9's all-reduce + residual add + RMSNorm kernel against NCCL's
    all-reduce and then the same add and norm in torch, eagerly and replayed from a CUDA graph,
    five calls in a row (both halves of the buffer, the counters advancing) on each rank's own
    random numbers."""
    import torch.distributed as dist

    from minisgl.distributed.all_reduce_norm import AllReduceAddNorm
    from minisgl.layers.decode_kernels import graph_work

    device = settings["device"]
    fused = AllReduceAddNorm(device)

    def reference(partial, residual, weight, eps):
        h = partial.clone()
        dist.all_reduce(h)
        residual = h if residual is None else h + residual
        x32 = residual.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(residual.dtype), residual

    def handle(command: dict) -> dict:
        report = []
        for dtype in (torch.bfloat16, torch.float32):
            for rows, hidden, first in ((1, 4096, False), (3, 1024, False), (256, 4096, False), (1, 4096, True)):
                # each rank's own partial sums; the residual stream and the norm are the same on every rank
                # (first: no residual stream yet, as after the embedding)
                mine = torch.Generator(device=device).manual_seed(1000 * rank + rows)
                shared = torch.Generator(device=device).manual_seed(rows)
                weight = (1 + 0.1 * torch.randn(hidden, generator=shared, device=device)).to(dtype)
                calls = [(torch.randn(rows, hidden, dtype=dtype, device=device, generator=mine),
                          torch.randn(rows, hidden, dtype=dtype, device=device, generator=shared))
                         for _ in range(5)]
                static_partial, static_residual = torch.zeros(rows, hidden, dtype=dtype, device=device), \
                    torch.zeros(rows, hidden, dtype=dtype, device=device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out, static_new = fused(static_partial, None if first else static_residual, weight, 1e-6)
                for i, (partial, residual) in enumerate(calls):
                    residual = None if first else residual
                    want, want_residual = reference(partial, None if first else residual.clone(), weight, 1e-6)
                    if i % 2:  # replayed from the graph, inputs copied into its tensors
                        static_partial.copy_(partial)
                        if not first:
                            static_residual.copy_(residual)
                        graph.replay()
                        out, got_residual = static_out.clone(), static_new.clone()
                    else:
                        out, got_residual = fused(partial, None if first else residual.clone(), weight, 1e-6)
                    torch.cuda.synchronize()
                    both = [torch.empty_like(out) for _ in range(size)]
                    dist.all_gather(both, out)
                    with graph_work():  # where the engine takes this path (see AllReduceAddNorm.fits)
                        fits = fused.fits(partial)
                    case = f"{dtype} [{rows}, {hidden}]{' first layer' if first else ''} call {i}"
                    report.append({"case": case, "fits": fits and not fused.fits(partial),
                                   "residual_equal": torch.equal(got_residual, want_residual),
                                   "ranks_equal": all(torch.equal(b, both[0]) for b in both),
                                   "max_diff": (out.float() - want.float()).abs().max().item(),
                                   "scale": want.float().abs().max().item()})
        return {"report": report}

    return handle, {}


def test_fused_all_reduce_add_norm_matches_the_separate_steps() -> None:
    """The sum and the new residual stream bit for bit (a two-rank sum in float32, rounded once,
    is NCCL's); the normed rows within bf16's rounding of torch's (the mean of squares is summed
    in another order); every rank's rows the same bits."""
    for row in rank_reports("fused_add_norm_rank"):
        assert row["fits"] and row["residual_equal"] and row["ranks_equal"], row
        assert row["max_diff"] <= 2 ** -7 * row["scale"], row


def all_gather_rank(settings: dict, rank: int, size: int):
    """A RankProcesses worker: lesson 9's logits all-gather over symmetric memory against NCCL's
    all-gather with the rank dimension moved last, eagerly and replayed from a CUDA graph, five
    calls in a row, on each rank's own random numbers."""
    import torch.distributed as dist

    from minisgl.distributed.all_gather import SymmetricAllGather
    from minisgl.layers.decode_kernels import graph_work

    device = settings["device"]
    gather = SymmetricAllGather(device)

    def handle(command: dict) -> dict:
        report = []
        for dtype in (torch.bfloat16, torch.float32):
            for rows, n in ((1, 75968), (1, 64128), (3, 1000), (16, 8192)):  # (the 0.6B and 8B shapes' vocab at TP=2)
                mine = torch.Generator(device=device).manual_seed(1000 * rank + rows)
                calls = [torch.randn(rows, n, dtype=dtype, device=device, generator=mine) for _ in range(5)]
                static_x = torch.zeros(rows, n, dtype=dtype, device=device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = gather(static_x)
                for i, x in enumerate(calls):
                    stacked = torch.empty(size, rows, n, dtype=dtype, device=device)
                    dist.all_gather_into_tensor(stacked, x)
                    want = torch.cat(stacked.unbind(0), dim=-1)
                    if i % 2:
                        static_x.copy_(x)
                        graph.replay()
                        got = static_out.clone()
                    else:
                        got = gather(x)
                    torch.cuda.synchronize()
                    with graph_work():
                        fits = gather.fits(x)
                    report.append({"case": f"{dtype} [{rows}, {n}] call {i}", "fits": fits and not gather.fits(x),
                                   "equal": torch.equal(got, want)})
        return {"report": report}

    return handle, {}


def test_symmetric_all_gather_equals_nccls() -> None:
    """The logits' all-gather over symmetric memory: NCCL's result bit for bit, eager and in a graph."""
    for row in rank_reports("all_gather_rank"):
        assert row["fits"] and row["equal"], row


def test_the_ranks_use_symmetric_memory_where_they_can() -> None:
    path = tiny_checkpoint("qwen3", **GPU_CHECKPOINT_KWARGS)
    with LLM(path, device="cuda", tp_size=2, num_pages=64, max_running=4, cuda_graph_max_bs=4) as llm:
        assert llm.core.all_reduce.startswith("symmetric memory"), llm.core.all_reduce
        assert llm.core.all_reduce.endswith("fused with the residual add and RMSNorm after it"), llm.core.all_reduce
        fast = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    with LLM(path, device="cuda", tp_size=2, num_pages=64, max_running=4, cuda_graph_max_bs=4,
             tp_all_reduce="symmetric") as llm:
        assert llm.core.all_reduce == "symmetric memory, NCCL above 4 MiB", llm.core.all_reduce
        unfused = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    with LLM(path, device="cuda", tp_size=2, num_pages=64, max_running=4, cuda_graph_max_bs=4,
             tp_all_reduce="nccl") as llm:
        assert llm.core.all_reduce == "NCCL"
        plain = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    # Symmetric memory's sums are NCCL's to the bit. The fused norm rounds as Hugging Face does,
    # not as FlashInfer's add + RMSNorm: its tokens may part from these at a close call, and the
    # bf16 parity test above holds it to HF's.
    assert unfused[0].token_ids == plain[0].token_ids
    assert len(fast[0].token_ids) == len(plain[0].token_ids)
