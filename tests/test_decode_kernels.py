"""Lesson 8's decode kernels (``minisgl/layers/decode_kernels.py``): each fused kernel against
the path it replaces, and the model built with them against the plain one.

On the CPU the kernels never run (no Triton, float32): :class:`DecodeLayers` must give exactly
lesson 1's model. On the GPU (``pytest -m gpu tests/test_decode_kernels.py``) the one-row GEMV
is held to the rounding of an exact product, the fused q/k norms + RoPE to the unfused torch and
FlashInfer paths, and a captured bs=1 decode step must run both kernels and match HF.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.kernels import matmul_shapes
from minisgl import LLM, SamplingParams
from minisgl.attention.base import NoCacheBackend
from minisgl.layers import fused
from minisgl.layers.decode_kernels import DecodeLayers, DecodeLinear, DecodeMLP, DecodeRotary, qk_norm_rope, use_triton
from minisgl.models.loader import load_model
from minisgl.models.model import Layers
from minisgl.testing import (
    GPU_CHECKPOINT_KWARGS,
    LOGIT_GAP_TOLERANCE,
    HFReference,
    TeacherForcingSampler,
    confident_disagreements,
    tiny_checkpoint,
)

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# --- CPU: the seam gives lesson 1's model exactly -----------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_decode_layers_build_the_same_model_with_the_same_results_on_cpu(arch: str) -> None:
    path = tiny_checkpoint(arch)
    plain, decode = load_model(path), load_model(path, layers=DecodeLayers())
    assert list(plain.state_dict()) == list(decode.state_dict()), "same parameters, same names"
    attn = decode.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, DecodeLinear) and isinstance(attn.rotary, DecodeRotary)
    assert isinstance(decode.lm_head, DecodeLinear) and (arch != "qwen3" or attn.q_norm is not None)
    assert isinstance(decode.model.layers[0].mlp, DecodeMLP), "the down projection applies the activation itself"
    ids = torch.tensor([5, 17, 99, 3, 42])
    for rows in (ids, ids[:1]):  # a prefill and a one-row (decode-shaped) input
        pos = torch.arange(rows.numel())
        assert torch.equal(plain(rows, pos, NoCacheBackend()), decode(rows, pos, NoCacheBackend()))
    assert not use_triton(torch.ones(2)), "no Triton kernel on the CPU"


def test_logits_written_into_the_given_buffer_in_the_models_dtype() -> None:
    """The graph runner's seam: ``out=`` receives the logits, and the model returns that
    buffer, not a copy. Logits stay in the model's dtype (no float32 copy of ``[B, vocab]``;
    tests/test_sampler.py checks the sampler gives the same tokens on them)."""
    model = load_model(tiny_checkpoint("qwen3"), dtype=torch.bfloat16)
    ids, pos = torch.tensor([5, 17, 99]), torch.arange(3)
    logits = model(ids, pos, NoCacheBackend())
    out = torch.full((3, model.config.vocab_size), float("nan"), dtype=torch.bfloat16)
    returned = model(ids, pos, NoCacheBackend(), out=out)
    assert returned is out and out.dtype == logits.dtype == torch.bfloat16
    assert torch.equal(out, logits)


def test_gemv_refuses_weights_beyond_int32_offsets() -> None:
    from minisgl.layers.decode_kernels import fits_int32_offsets

    assert fits_int32_offsets(torch.empty(151936, 1024, device="meta"))
    assert not fits_int32_offsets(torch.empty(262144, 8192, device="meta")), "2^31 elements: cuBLAS takes it"


def test_the_builder_uses_decode_layers_where_lesson_8_is_on() -> None:
    llm = LLM(tiny_checkpoint("qwen3"), device="cpu", cuda_graph_max_bs=4)
    assert isinstance(llm.model.model.layers[0].mlp.down_proj, DecodeLinear)
    assert type(Layers().rotary(8, 1e4, None, 16)).__name__ == "RotaryEmbedding"
    off = LLM(tiny_checkpoint("qwen3"), device="cpu", cuda_graph_max_bs=0)  # lesson 8 off: lesson 1's layers
    assert type(off.model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert off.graph_memory is None and off.graph_memory_bytes == 0 and llm.graph_memory_bytes == 0  # no runner / CPU


# --- GPU: each kernel against what it replaces ------------------------------------------------


def beyond_rounding(out: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Elements of ``out`` (16-bit) farther from the float32 ``exact`` than rounding allows
    (half a bf16 ulp, plus float32 accumulation noise)."""
    return (out.float() - exact).abs() > exact.abs() * 2 ** -8 * 1.02 + 1e-4


@gpu
@needs_cuda
@pytest.mark.parametrize("shape", ["qwen3-0.6b", "llama-3.1-8b", "qwen3-30b-a3b"])
def test_gemv_is_an_exact_product_rounded_once(shape: str) -> None:
    from minisgl.layers.decode_kernels import gemv

    torch.manual_seed(0)
    for name, (n, k) in matmul_shapes(shape).items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.05
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
        exact = x.double() @ w.double().T
        out = gemv(x, w)
        assert out.shape == (1, n) and out.dtype == torch.bfloat16
        bad = beyond_rounding(out, exact.float())
        assert not bad.any(), f"{name}: {int(bad.sum())} of {n} outputs off by more than rounding"
        cublas = F.linear(x, w)
        assert (out.float() - cublas.float()).abs().max() <= exact.abs().max() * 2 ** -7, name
        del w


@gpu
@needs_cuda
@pytest.mark.parametrize("n,k,blocks", [(1000, 1000, None), (37, 3000, (4, 512)), (4096, 128, (64, 128)),
                                        (5, 7, None)])
def test_gemv_uneven_shapes_bias_and_tiles(n: int, k: int, blocks) -> None:
    from minisgl.layers.decode_kernels import gemv

    torch.manual_seed(1)
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    for bias in (None, b):
        exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
        out = gemv(x, w, bias, blocks=blocks)
        assert not beyond_rounding(out, exact.float()).any(), (n, k, blocks, bias is None)
    with pytest.raises(ValueError, match="contiguous along K"):
        gemv(x.t().contiguous().t().expand(2, k), w)


@gpu
@needs_cuda
@pytest.mark.parametrize("n,k", [matmul_shapes("qwen3-0.6b")["down_proj"], matmul_shapes("llama-3.1-8b")["down_proj"],
                                 (37, 296)])  # K % 8 == 0: FlashInfer's activation needs 16-byte rows
def test_gemv_with_silu_and_mul_is_the_down_projection_of_swiglu(n: int, k: int) -> None:
    """The fused activation: ``gemv([gate | up], W, silu_and_mul=True)`` against the exact
    product of the activation as FlashInfer computes it (float32, rounded once), and the
    ``DecodeLinear`` / ``decode_linear`` paths in and out of a graph's work agree with it."""
    from minisgl.layers.decode_kernels import decode_linear, gemv, graph_work, swiglu

    torch.manual_seed(2)
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.05
    gate_up = torch.randn(1, 2 * k, dtype=torch.bfloat16, device="cuda") * 2
    gate, up = gate_up.float().chunk(2, dim=-1)
    act = (F.silu(gate) * up).to(torch.bfloat16)
    assert torch.equal(swiglu(gate_up), act) or (swiglu(gate_up).float() - act.float()).abs().max() <= \
        act.float().abs().max() * 2 ** -8, "FlashInfer's activation rounds once"
    exact = act.double() @ w.double().T
    out = gemv(gate_up, w, silu_and_mul=True)
    assert out.shape == (1, n) and out.dtype == torch.bfloat16
    tolerance = exact.abs().max() * 2 ** -7
    assert (out.double() - exact).abs().max() <= tolerance
    with graph_work():  # inside a graph's work: the fused GEMV
        assert torch.equal(decode_linear(gate_up, w, silu_and_mul=True), out)
    eager = decode_linear(gate_up, w, silu_and_mul=True)  # outside: the activation kernel, then cuBLAS
    assert (eager.double() - exact).abs().max() <= tolerance
    with pytest.raises(ValueError, match=f"x \\[1, {2 * k}\\]"):
        gemv(gate_up[:, :k], w, silu_and_mul=True)


@gpu
@needs_cuda
@pytest.mark.parametrize("n,k,add", [(*matmul_shapes("qwen3-0.6b")["qkv_proj"], True),
                                     (*matmul_shapes("qwen3-0.6b")["gate_up_proj"], False),
                                     (*matmul_shapes("qwen3-30b-a3b")["qkv_proj"], True),
                                     (*matmul_shapes("llama-3.1-8b")["qkv_proj"], True), (37, 300, True)])
def test_norm_gemv_is_the_residual_add_and_rmsnorm_then_the_projection(n: int, k: int, add: bool) -> None:
    """The pre-norm step fused into the GEMV: the new residual is the 16-bit sum, bit for bit;
    the product is that of the norm as Hugging Face rounds it, rounded once; and
    ``DecodeLinear.forward_normed`` runs it inside a graph's work for rows of at most
    ``GEMV_NORMED_MAX_K`` (Llama's 4,096 keep the norm's kernel), FlashInfer's norm + cuBLAS
    outside, all within the tolerance of the exact product."""
    from minisgl.layers.decode_kernels import GEMV_NORMED_MAX_K, graph_work, norm_gemv
    from minisgl.layers.norm import RMSNorm

    torch.manual_seed(3)
    linear = DecodeLinear(k, n, bias=False).to("cuda", torch.bfloat16)
    norm = RMSNorm(k, 1e-6).to("cuda", torch.bfloat16)
    with torch.no_grad():
        linear.weight.normal_(0, 0.05)
        norm.weight.uniform_(0.5, 1.5)
    h = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn(1, k, dtype=torch.bfloat16, device="cuda") * 4 if add else None
    stream = h + residual if add else h  # HF's add, in bf16
    x32 = stream.float() * torch.rsqrt(stream.float().pow(2).mean(-1, keepdim=True) + norm.eps)
    normed = norm.weight * x32.to(torch.bfloat16)  # HF's rounding
    exact = normed.double() @ linear.weight.double().T
    h_before, res_before = h.clone(), None if residual is None else residual.clone()
    out, new_residual = norm_gemv(h, residual, norm.weight, norm.eps, linear.weight)
    assert out.shape == (1, n) and torch.equal(new_residual, stream)
    assert torch.equal(h, h_before) and (residual is None or torch.equal(residual, res_before)), "inputs untouched"
    bad = beyond_rounding(out, exact.float())
    assert not bad.any(), f"{int(bad.sum())} of {n} outputs off by more than rounding"
    with graph_work():
        fused_out, fused_res = linear.forward_normed(norm, h.clone(), None if residual is None else residual.clone())
    assert torch.equal(fused_res, stream)
    assert torch.equal(fused_out, out) if k <= GEMV_NORMED_MAX_K else \
        (fused_out.double() - exact).abs().max() <= exact.abs().max() * 2 ** -6
    eager_out, _ = linear.forward_normed(norm, h.clone(), None if residual is None else residual.clone())
    assert (eager_out.double() - exact).abs().max() <= exact.abs().max() * 2 ** -6, "FlashInfer's norm + cuBLAS"
    with pytest.raises(ValueError, match="the norm's weight"):
        norm_gemv(h, residual, norm.weight[:-1], norm.eps, linear.weight)
    with pytest.raises(ValueError, match="one chunk"):
        norm_gemv(h, residual, norm.weight, norm.eps, linear.weight, blocks=(1, 16))


def _paged_problem(lens: list[int], hq: int, hkv: int, d: int = 128, page_size: int = 16, seed: int = 0):
    """A pool layer with random history for rows of ``lens`` tokens (the new one included), on
    shuffled pages, plus the new tokens' q/k/v as views of one QKV output."""
    torch.manual_seed(seed)
    pages_per_row = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per_row) + 4
    k_cache = torch.randn(num_pages, page_size, hkv, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(num_pages, device="cuda").to(torch.int32)
    indptr = torch.tensor([0] + pages_per_row, device="cuda").cumsum(0).to(torch.int32)
    indices = order[: sum(pages_per_row)].contiguous()
    last = torch.tensor([(n - 1) % page_size + 1 for n in lens], dtype=torch.int32, device="cuda")
    qkv = torch.randn(len(lens), (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    q = qkv[:, : hq * d].view(-1, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(-1, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(-1, hkv, d)
    return q, k, v, k_cache, v_cache, indptr, indices, last


def _reference_decode(q, k, v, k_cache, v_cache, indptr, indices, lens):
    """Every row's attention over its pages with its new K/V written at its last position, in
    float64; and the pool as the append must leave it."""
    k_after, v_after = k_cache.clone(), v_cache.clone()
    ps, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    outs = []
    for row, n in enumerate(lens):
        pages = indices[indptr[row]: indptr[row + 1]].long()
        k_after[pages[(n - 1) // ps], (n - 1) % ps] = k[row]
        v_after[pages[(n - 1) // ps], (n - 1) % ps] = v[row]
        keys = k_after[pages].flatten(0, 1)[:n].double().repeat_interleave(group, 1)  # [n, Hq, D]
        values = v_after[pages].flatten(0, 1)[:n].double().repeat_interleave(group, 1)
        scores = torch.einsum("hd,nhd->hn", q[row].double(), keys) * q.shape[-1] ** -0.5
        outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values))
    return torch.stack(outs), k_after, v_after


@gpu
@needs_cuda
@pytest.mark.parametrize("hq,hkv", [(16, 8), (32, 8), (12, 2), (8, 8)])
def test_append_decode_attention_appends_and_attends_like_the_reference(hq: int, hkv: int) -> None:
    """One kernel for append + split-KV attention + merge: rows of one piece and of many
    (up to the sixteen pieces of a long context), page boundaries on both sides, GQA groups of
    1, 2, 4 and 6 (padded to 8); the pool afterwards holds exactly the new K/V."""
    from minisgl.attention.fused_decode import AppendDecodeWorkspace, append_decode_attention

    lens = [1, 15, 16, 17, 129, 300, 2049, 9000]
    q, k, v, k_cache, v_cache, indptr, indices, last = _paged_problem(lens, hq, hkv, seed=hq + hkv)
    expected, k_after, v_after = _reference_decode(q, k, v, k_cache, v_cache, indptr, indices, lens)
    workspace = AppendDecodeWorkspace(len(lens), hq, hkv, q.shape[-1], q.device)
    out = append_decode_attention(q, k, v, k_cache, v_cache, indptr, indices, last, workspace)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    assert torch.equal(k_cache, k_after) and torch.equal(v_cache, v_after), "the new K/V and nothing else"
    assert not workspace.arrivals.any(), "every counter back to zero for the next launch"


@gpu
@needs_cuda
@pytest.mark.parametrize("qk_norm", [True, False])
def test_append_decode_attention_rotates_q_and_k_like_the_separate_kernels(qk_norm: bool) -> None:
    """With a ``QKRotation`` the kernel takes q/k straight from the QKV projection and applies
    Qwen3's q/k norms (``qk_norm``) and RoPE itself: the same output and the same pool as
    ``qk_norm_rope`` (or FlashInfer's RoPE) followed by the kernel, up to one bf16 rounding
    step; the given q/k are left as they were."""
    from minisgl.attention.fused_decode import AppendDecodeWorkspace, QKRotation, append_decode_attention
    from minisgl.layers.rotary import RotaryEmbedding

    lens = [1, 17, 300, 2049]
    q, k, v, k_cache, v_cache, indptr, indices, last = _paged_problem(lens, 32, 4, seed=11)
    positions = torch.tensor([n - 1 for n in lens], device="cuda")
    cache = RotaryEmbedding(128, 1e6, None, 4096).cuda().cos_sin_cache()
    g = torch.Generator("cuda").manual_seed(0)
    q_weight, k_weight = ((1 + 0.2 * torch.randn(2, 128, device="cuda", generator=g)).bfloat16() if qk_norm
                          else (None, None))
    q_rot, k_rot = q.clone(), k.clone()
    if qk_norm:
        qk_norm_rope(positions, q_rot, k_rot, q_weight, k_weight, 1e-6, cache)
    else:
        fused.apply_rope(positions, q_rot, k_rot, cache)
    k_cache2, v_cache2 = k_cache.clone(), v_cache.clone()
    workspace = AppendDecodeWorkspace(len(lens), 32, 4, 128, q.device)
    expected = append_decode_attention(q_rot, k_rot, v, k_cache2, v_cache2, indptr, indices, last, workspace)
    q_before, k_before = q.clone(), k.clone()
    out = append_decode_attention(q, k, v, k_cache, v_cache, indptr, indices, last, workspace,
                                  rotation=QKRotation(positions, cache, q_weight, k_weight, 1e-6))
    torch.testing.assert_close(out.float(), expected.float(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(k_cache.float(), k_cache2.float(), rtol=2**-7, atol=1e-5)
    assert torch.equal(v_cache, v_cache2)
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "q/k rotated in registers only"
    assert not workspace.arrivals.any()


@gpu
@needs_cuda
def test_append_decode_attention_replays_in_a_graph_for_every_context_length() -> None:
    """Captured once, replayed with other metadata in the same buffers: a row's number of
    pieces is decided on the device, so short and long contexts both come out right; repeated
    replays of a many-piece batch give the same bits (the last piece to arrive merges, in a
    fixed order, whichever that is)."""
    from minisgl.attention.fused_decode import AppendDecodeWorkspace, append_decode_attention

    hq, hkv, d = 16, 8, 128
    cases = [[3, 40], [5000, 17], [16, 12000]]
    max_pages = max(-(-n // 16) for lens in cases for n in lens)
    problems = [_paged_problem(lens, hq, hkv, seed=i) for i, lens in enumerate(cases)]
    workspace = AppendDecodeWorkspace(2, hq, hkv, d, torch.device("cuda"))
    q, k, v = (torch.zeros(2, h, d, dtype=torch.bfloat16, device="cuda") for h in (hq, hkv, hkv))
    indptr = torch.zeros(3, dtype=torch.int32, device="cuda")
    indices = torch.zeros(2 * max_pages, dtype=torch.int32, device="cuda")
    last = torch.ones(2, dtype=torch.int32, device="cuda")
    pool_k = torch.zeros(2 * max_pages + 8, 16, hkv, d, dtype=torch.bfloat16, device="cuda")
    pool_v = torch.zeros_like(pool_k)
    out = torch.empty(2, hq, d, dtype=torch.bfloat16, device="cuda")

    def load(problem) -> torch.Tensor:
        pq, pk, pv, kc, vc, pindptr, pindices, plast = problem
        for dst, src in ((q, pq), (k, pk), (v, pv), (indptr, pindptr), (last, plast)):
            dst.copy_(src)
        indices[: pindices.numel()].copy_(pindices)
        pool_k[: kc.shape[0]].copy_(kc)
        pool_v[: vc.shape[0]].copy_(vc)
        return _reference_decode(pq, pk, pv, kc, vc, pindptr, pindices, lens)[0]

    def launch() -> None:
        append_decode_attention(q, k, v, pool_k, pool_v, indptr, indices, last, workspace, out=out)

    lens = cases[0]
    load(problems[0])
    launch()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for lens, problem in zip(cases, problems):
        expected = load(problem)
        graph.replay()
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
        first = out.clone()
        for _ in range(50):
            graph.replay()
        assert torch.equal(out, first), f"{lens}: a replay merged differently"
    assert not workspace.arrivals.any()


def _qkv_views(t: int, hq: int, hkv: int, d: int, seed: int):
    torch.manual_seed(seed)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda") * 3
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d)
    return qkv, q, k


@gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_qk_norm_rope_equals_the_unfused_norms_and_rope(tokens: int) -> None:
    from minisgl.layers.norm import RMSNorm

    hq, hkv, d, eps = 16, 8, 128, 1e-6
    rotary = DecodeRotary(d, 1e6, None, 40960).cuda()
    q_norm, k_norm = RMSNorm(d, eps).cuda().bfloat16(), RMSNorm(d, eps).cuda().bfloat16()
    with torch.no_grad():
        q_norm.weight.uniform_(0.3, 2.0)
        k_norm.weight.uniform_(0.3, 2.0)
    positions = torch.randint(0, 40960, (tokens,), device="cuda")
    qkv, q, k = _qkv_views(tokens, hq, hkv, d, seed=tokens)
    v_before = qkv[:, (hq + hkv) * d:].clone()
    references = {}
    for name, enabled in (("torch (HF's rounding)", False), ("FlashInfer", True)):
        fused.set_fused_kernels(enabled)
        try:
            _, rq, rk = _qkv_views(tokens, hq, hkv, d, seed=tokens)
            with torch.no_grad():
                references[name] = unfused_rotary(rotary, positions, rq, rk, q_norm, k_norm)
        finally:
            fused.set_fused_kernels(True)
    with torch.no_grad():
        out_q, out_k = rotary(positions, q, k, q_norm, k_norm)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr(), "in place, on the QKV output"
    assert torch.equal(qkv[:, (hq + hkv) * d:], v_before), "v untouched"
    for name, (rq, rk) in references.items():
        # The torch path rounds where HF and this kernel do: one bf16 ulp apart at most.
        # FlashInfer's norm rounds once, not twice (before and after the weight): two ulps.
        ulps = 1 if name.startswith("torch") else 2
        for ours, ref in ((out_q, rq), (out_k, rk)):
            torch.testing.assert_close(ours.float(), ref.float(), rtol=ulps * 2 ** -7, atol=ulps * 2 ** -6,
                                       msg=lambda m, name=name: f"{name}: {m}")
    ref_q = references["torch (HF's rounding)"][0]
    assert (out_q != ref_q).float().mean() < 0.01, "HF's rounding: nearly every element identical"


def compiled_variants(kernel) -> int:
    """How many variants of a Triton kernel have been compiled in this process (Triton 3.x keeps a
    per-device ``(kernel cache, ...)`` tuple in ``device_caches``)."""
    caches = getattr(kernel, "device_caches", None)
    if not caches:
        pytest.skip("this Triton keeps its compiled kernels elsewhere")
    return sum(len(entry[0]) for entry in caches.values())


@gpu
@needs_cuda
def test_qk_norm_rope_is_compiled_once_whatever_the_positions_alignment_and_token_count() -> None:
    """A batch's positions are a view into one staged buffer, at an odd int64 offset whenever the
    tensor before them has an odd length. The kernel must give the same result there and must
    not compile another variant in the middle of serving (it did: 150-250 ms on the first mixed
    step of the yardstick)."""
    from minisgl.layers.decode_kernels import QK_NORM_ROPE_MANY_TOKENS, _qk_norm_rope_kernel, qk_norm_rope

    hq, hkv, d = 16, 8, 128
    cache = DecodeRotary(d, 1e6, None, 40960).cuda().cos_sin_cache()
    weights = torch.rand(2, d, device="cuda").bfloat16() + 0.5
    staged = torch.randint(0, 40960, (1 + 2 * QK_NORM_ROPE_MANY_TOKENS,), device="cuda")

    def run(positions: torch.Tensor) -> torch.Tensor:  # the same inputs, row for row, for any count
        qkv, _, _ = _qkv_views(2 * QK_NORM_ROPE_MANY_TOKENS, hq, hkv, d, seed=0)
        qkv = qkv[: positions.numel()]
        q = qkv[:, : hq * d].view(-1, hq, d)
        k = qkv[:, hq * d: (hq + hkv) * d].view(-1, hkv, d)
        qk_norm_rope(positions, q, k, weights[0], weights[1], 1e-6, cache)
        return qkv

    for tokens in (3, 2 * QK_NORM_ROPE_MANY_TOKENS):  # one program per token and head; 16 tokens per program
        unaligned = staged[1:1 + tokens]
        assert unaligned.data_ptr() % 16 == 8
        aligned = run(unaligned.clone())  # the same positions in a fresh (aligned) tensor
        before = compiled_variants(_qk_norm_rope_kernel)
        assert torch.equal(run(unaligned), aligned)
        assert torch.equal(run(staged[1:tokens]), aligned[: tokens - 1])  # another count, not a multiple of 16
        assert compiled_variants(_qk_norm_rope_kernel) == before, "no new variant for the alignment or the count"


def unfused_rotary(rotary, positions, q, k, q_norm, k_norm):
    """Lesson 1's path (norms, then FlashInfer's or torch's RoPE), bypassing the fused kernel."""
    from minisgl.layers.rotary import RotaryEmbedding

    return RotaryEmbedding.forward(rotary, positions, q, k, q_norm, k_norm)


@gpu
@needs_cuda
@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_a_captured_bs1_decode_step_runs_the_fused_kernels_and_matches_hf(arch: str) -> None:
    """One request at a time, so every decode step is a one-row replay of bucket 1: HF's tokens
    fed back, the logits of every step must pick HF's token wherever HF is confident (bf16
    top-2 gap rule), and the profile must show the kernels of this module."""
    from torch.profiler import ProfilerActivity, profile

    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    # The last prompt is longer than FUSED_DECODE_MAX_CONTEXT: its steps replay FlashInfer's graph.
    prompts = [[11, 52, 7, 300, 41, 9, 18], [400, 3] * 20, [77], [(7 * i + 3) % 500 for i in range(1100)]]
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    references = [hf.greedy_with_logits(p, 32) for p in prompts]
    llm = LLM(path, device="cuda", num_pages=128, max_running=4, cuda_graph_max_bs=4)
    forcing = TeacherForcingSampler({tuple(p): ref for p, (ref, _) in zip(prompts, references)})
    llm.engine.sampler = forcing
    variants = set()
    for slot in llm.engine.runner.slots:
        def prepare(meta, variant=None, real=slot.attention.prepare):
            variants.add(chosen := real(meta, variant))
            return chosen
        slot.attention.prepare = prepare
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for p in prompts:
            llm.generate([p], SamplingParams(max_tokens=32, ignore_eos=True), progress=False)
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any("_gemv_kernel" in n for n in names), "one-row projections run the GEMV"
    # FlashInfer's RMSNorm kernels: 2 x layers + 1 a step before the pre-norm steps ran inside the
    # projections; now a one-row replay has only the final norm (the eager prefills keep theirs).
    graph_steps = sum(llm.engine.runner.stats.replays.values())
    norms = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "RMSNorm" in e.name)
    assert graph_steps <= norms < 2 * graph_steps, (norms, graph_steps)
    assert any("_append_decode_kernel" in n for n in names), "one kernel for a small batch's attention"
    assert variants == {"fused", ""}, "short contexts replay the fused graph, the long one FlashInfer's"
    assert (arch == "qwen3") == any("_qk_norm_rope_kernel" in n for n in names), "Qwen3's norms + RoPE fused"
    assert llm.engine.runner.stats.replays.get(1, 0) >= 4 * 30, llm.engine.runner.stats
    confident = 0
    for p, (_, hf_logits) in zip(prompts, references):
        n, wrong = confident_disagreements(forcing.logits(p), hf_logits, LOGIT_GAP_TOLERANCE)
        assert wrong == [], f"{arch}: differs from HF at confident positions {wrong}"
        confident += n
    assert confident >= 4 * 32 // 4


@gpu
@needs_cuda
@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen3_moe"])
def test_programmatic_dependent_launch_changes_no_bit_of_any_step(arch: str) -> None:
    """PDL only lets each kernel launch early and load its weights while the one before it
    finishes: the arithmetic is the same, so every logit of every step must be bit-equal with it
    off, early and late. (A kernel that read its input before waiting, or a program that skipped the wait,
    would read a stale activation and fail here.) Single requests replay bucket 1 (the one-row
    kernels); the batch of four the bigger buckets; the 80-token prompt splits its attention."""
    from minisgl.layers import decode_kernels

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    assert decode_kernels.pdl(torch.empty(1, device="cuda")), "on by default on this GPU"
    path = tiny_checkpoint(arch, **GPU_CHECKPOINT_KWARGS)
    prompts = [[11, 52, 7, 300, 41, 9, 18], [400, 3] * 40, [77], [(7 * i + 3) % 500 for i in range(30)]]
    forced = {tuple(p): [(13 * i + len(p)) % 500 for i in range(24)] for p in prompts}
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    def logits(mode: int) -> list[torch.Tensor]:
        decode_kernels.set_pdl(mode)
        try:
            llm = LLM(path, device="cuda", num_pages=128, max_running=4, cuda_graph_max_bs=4)
            llm.engine.sampler = forcing = TeacherForcingSampler(forced)
            for p in prompts:  # one at a time, then all four together
                llm.generate([p], params, progress=False)
            one_by_one = [forcing.logits(p) for p in prompts]
            llm.engine.sampler = forcing = TeacherForcingSampler(forced)
            llm.generate(prompts, [params] * len(prompts), progress=False)
            assert llm.engine.runner.stats.replays.get(1, 0) >= len(prompts) * 20, llm.engine.runner.stats
            return one_by_one + [forcing.logits(p) for p in prompts]
        finally:
            decode_kernels.set_pdl(default)

    default = decode_kernels._pdl_mode
    without = logits(decode_kernels.PDL_OFF)
    for mode in (decode_kernels.PDL_EARLY, decode_kernels.PDL_LATE):
        for i, (a, b) in enumerate(zip(logits(mode), without)):
            assert torch.equal(a, b), f"PDL mode {mode}, run {i}: logits differ by up to {(a - b).abs().max().item()}"
