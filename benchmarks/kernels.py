"""Lesson 8's decode kernels against what they replace, one kernel at a time (GPU).

Every figure is µs per call inside a CUDA graph (``--calls`` calls per graph, so launch latency
counts as it does in a captured decode step), bf16:

* **one-row matmuls** of the Qwen3-0.6B and Llama-3.1-8B shapes (QKV, o, gate/up, down, LM
  head): cuBLAS (``F.linear``) against :func:`~minisgl.layers.decode_kernels.gemv` with its
  default tile, and a sweep of tiles (``--sweep``). Each call reads another copy of the
  weights, from a ring of at least ``--ring-mb`` MB, so no call finds its matrix in the L2 cache
  (the H200's holds 50 MB, more than a Qwen3 matrix);
* **Qwen3's q/k norms + RoPE**: FlashInfer's two RMSNorms and RoPE against the fused
  :func:`~minisgl.layers.decode_kernels.qk_norm_rope`, for 1 token (decode) and more;
* **SwiGLU's down projection**: FlashInfer's ``silu_and_mul`` then the GEMV, against the GEMV
  that applies the activation as it loads its input (``gemv(..., silu_and_mul=True)``);
* **the pre-norm step and the projection after it** (QKV, gate/up): FlashInfer's residual add +
  RMSNorm then the GEMV, against :func:`~minisgl.layers.decode_kernels.norm_gemv` (one kernel);
* **a small decode batch's attention, per layer**: FlashInfer's captured decode (KV append,
  split-KV decode, merge: three kernels) against the fused
  :func:`~minisgl.attention.fused_decode.append_decode_attention` (one), at batch sizes 1-16
  and contexts of 128-32768 tokens, each call on another layer of a pool large enough that no
  layer is still in the L2 cache (as in a real step, where the weights stream through it);
  ``--attention-sweep`` also times the fused kernel's tiles (piece size, block, warps);
* for the first two, the cost of a call **launched eagerly** (back to back, one sync at the
  end): for small inputs, the host's launch cost, which is what an eager step pays.

    python -m benchmarks kernels [--sweep] [--attention-sweep]     # GPU only
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.offline import SHAPES
from benchmarks.overlap import copy_bandwidth


def matmul_shapes(shape: str) -> dict[str, tuple[int, int]]:
    """``name -> (N, K)`` of each projection of ``shape`` (fused QKV and gate/up, as the model has them)."""
    c = SHAPES[shape]
    h, d = c["hidden_size"], c["head_dim"]
    q, kv, inter = c["num_attention_heads"] * d, c["num_key_value_heads"] * d, c["intermediate_size"]
    if "num_experts" in c:  # a mixture of experts: its MLPs are the experts (python -m benchmarks moe)
        return {"qkv_proj": (q + 2 * kv, h), "o_proj": (h, q), "lm_head": (c["vocab_size"], h)}
    return {"qkv_proj": (q + 2 * kv, h), "o_proj": (h, q), "gate_up_proj": (2 * inter, h),
            "down_proj": (h, inter), "lm_head": (c["vocab_size"], h)}


def graph_us(fn: Callable[[int], object], calls: int, replays: int = 20) -> float:
    """µs per call of ``fn(i)`` for ``i`` in ``0..calls-1``, all captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, picks algorithms) outside the capture
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def sweep_tiles(k: int) -> list[tuple[tuple[int, int], int]]:
    """``((BLOCK_N, BLOCK_K), num_warps)`` candidates for a K-column matrix."""
    out = []
    for block_k in (256, 512, 1024, 2048):
        if block_k > max(256, 2 * k):
            continue
        for tile in (2048, 4096, 8192, 16384):
            for warps in (4, 8):
                if tile // block_k >= 1:
                    out.append(((tile // block_k, block_k), warps))
    return out


def eager_us(fn: Callable[[int], object], calls: int = 500) -> float:
    """µs per call of ``fn(i)`` launched eagerly, back to back, one sync at the end: for small
    inputs this is the host's cost of launching (what an eager step pays per call)."""
    import time

    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def call(fn: Callable[..., object], args: tuple, _i: int) -> object:
    """``fn(*args)``, ignoring the call's index: with ``functools.partial``, a timed function that
    repeats the same call (for :func:`graph_us` and :func:`eager_us`)."""
    return fn(*args)


def ring_us(fn: Callable[..., object], x: torch.Tensor, weights: list[torch.Tensor], calls: int,
            eager: bool = False) -> float:
    """µs per call of ``fn(x, w)``, the calls taking the ``weights`` in turn, in a graph
    (:func:`graph_us`) or launched eagerly (:func:`eager_us`)."""
    def one(i: int) -> object:
        return fn(x, weights[i % len(weights)])

    return eager_us(one) if eager else graph_us(one, calls)


def bench_matmuls(shape: str, device: str, calls: int, ring_bytes: int, sweep: bool) -> list[dict]:
    import functools

    import torch.nn.functional as F

    from minisgl.layers.decode_kernels import gemv, gemv_blocks

    rows = []
    for name, (n, k) in matmul_shapes(shape).items():
        nbytes = 2 * n * k
        copies = max(2, -(-ring_bytes // nbytes))
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device=device) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, dtype=torch.bfloat16, device=device)
        row: dict = {"shape": shape, "matmul": name, "n": n, "k": k, "weight_bytes": nbytes, "ring_copies": copies,
                     "cublas_us": ring_us(F.linear, x, weights, calls), "gemv_blocks": list(gemv_blocks(n, k)),
                     "gemv_us": ring_us(gemv, x, weights, calls),
                     "eager_cublas_us": ring_us(F.linear, x, weights, calls, eager=True),
                     "eager_gemv_us": ring_us(gemv, x, weights, calls, eager=True)}
        for key in ("cublas", "gemv"):
            row[f"{key}_tb_s"] = nbytes / (row[f"{key}_us"] * 1e-6) / 1e12
        if sweep:
            tried = [{"blocks": list(blocks), "num_warps": warps,
                      "us": ring_us(functools.partial(gemv, blocks=blocks, num_warps=warps), x, weights, calls)}
                     for blocks, warps in sweep_tiles(k)]
            row["sweep"] = sorted(tried, key=lambda t: t["us"])
        rows.append(row)
        best = f", best of sweep {row['sweep'][0]['us']:.2f} us {row['sweep'][0]}" if sweep else ""
        print(f"  {shape} {name} [{n} x {k}] {nbytes / 1e6:.1f} MB: cuBLAS {row['cublas_us']:.2f} us "
              f"({row['cublas_tb_s']:.2f} TB/s), gemv {row['gemv_us']:.2f} us ({row['gemv_tb_s']:.2f} TB/s){best}")
        weights.clear()
    return rows


def unfused_qk_norm_rope(positions, q, k, q_weight, k_weight, eps, cos_sin_cache) -> None:
    """What the fused kernel replaces: FlashInfer's RMSNorm of q, of k, then its RoPE."""
    import flashinfer

    t, hq, d = q.shape
    qn = flashinfer.norm.rmsnorm(q.reshape(-1, d), q_weight, eps)
    kn = flashinfer.norm.rmsnorm(k.reshape(-1, d), k_weight, eps)
    flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
        positions=positions, query=qn.view(t, -1), key=kn.view(t, -1), head_size=d, cos_sin_cache=cos_sin_cache,
        is_neox=True)


def bench_qk_norm_rope(device: str, calls: int, tokens=(1, 8, 32, 128, 512, 4096, 8192)) -> list[dict]:
    """Qwen3-0.6B heads (16 q, 8 kv, head_dim 128): FlashInfer's three kernels vs the fused one."""
    import functools

    from minisgl.layers.decode_kernels import qk_norm_rope
    from minisgl.layers.rotary import RotaryEmbedding

    c = SHAPES["qwen3-0.6b"]
    hq, hkv, d, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    cos_sin = RotaryEmbedding(d, c["rope_theta"], None, 8192).to(device).cos_sin_cache()
    qw, kw = (torch.rand(d, dtype=torch.bfloat16, device=device) + 0.5 for _ in range(2))
    rows = []
    for t in tokens:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device=device)
        q, k = qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d)
        args = (torch.arange(t, device=device), q, k, qw, kw, eps, cos_sin)
        unfused, fused = (functools.partial(call, fn, args) for fn in (unfused_qk_norm_rope, qk_norm_rope))
        row = {"tokens": t, "unfused_us": graph_us(unfused, calls), "fused_us": graph_us(fused, calls),
               "eager_unfused_us": eager_us(unfused), "eager_fused_us": eager_us(fused)}
        rows.append(row)
        print(f"  q/k norms + RoPE, {t} tokens: FlashInfer (3 kernels) {row['unfused_us']:.2f} us, "
              f"fused {row['fused_us']:.2f} us; launched eagerly {row['eager_unfused_us']:.2f} vs "
              f"{row['eager_fused_us']:.2f} us per call")
    return rows


def bench_swiglu_down(shape: str, device: str, calls: int, ring_bytes: int, sweep: bool) -> dict:
    """``shape``'s down projection at bs=1: FlashInfer's activation kernel + the GEMV, against
    the GEMV with the activation fused in (and, with ``sweep``, its tiles); a ring of weight
    copies as in :func:`bench_matmuls`."""
    from minisgl.layers.decode_kernels import gemv, swiglu

    n, k = matmul_shapes(shape)["down_proj"]
    copies = max(2, -(-ring_bytes // (2 * n * k)))
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device=device) * 0.02 for _ in range(copies)]
    gate_up = torch.randn(1, 2 * k, dtype=torch.bfloat16, device=device)
    row = {"shape": shape, "n": n, "k": k,
           "separate_us": ring_us(lambda x, w: gemv(swiglu(x), w), gate_up, weights, calls),
           "fused_us": ring_us(lambda x, w: gemv(x, w, silu_and_mul=True), gate_up, weights, calls)}
    if sweep:
        tried = [{"blocks": list(blocks), "num_warps": warps,
                  "us": ring_us(lambda x, w, b=blocks, nw=warps: gemv(x, w, blocks=b, num_warps=nw, silu_and_mul=True),
                                gate_up, weights, calls)}
                 for blocks, warps in sweep_tiles(k)]
        row["sweep"] = sorted(tried, key=lambda t: t["us"])
    print(f"  {shape} SwiGLU + down [{n} x {k}]: activation kernel + GEMV {row['separate_us']:.2f} us, "
          f"fused {row['fused_us']:.2f} us" + (f", best of sweep {row['sweep'][0]}" if sweep else ""))
    return row


def bench_norm_gemv(shape: str, device: str, calls: int, ring_bytes: int, sweep: bool) -> list[dict]:
    """``shape``'s two projections that follow a pre-norm step (QKV, gate/up; a mixture of
    experts': QKV, its gate/up is the experts') at bs=1:
    FlashInfer's residual add + RMSNorm then the GEMV, against :func:`norm_gemv` (and, with
    ``sweep``, its tiles); a ring of weight copies as in :func:`bench_matmuls`."""
    names = ("qkv_proj",) if "num_experts" in SHAPES[shape] else ("qkv_proj", "gate_up_proj")  # MoE: the router's
    return [norm_gemv_case(shape, name, device, calls, ring_bytes, sweep) for name in names]


def norm_gemv_case(shape: str, name: str, device: str, calls: int, ring_bytes: int, sweep: bool) -> dict:
    from minisgl.layers import fused
    from minisgl.layers.decode_kernels import gemv, gemv_blocks, norm_gemv

    eps = SHAPES[shape]["rms_norm_eps"]
    n, k = matmul_shapes(shape)[name]
    copies = max(2, -(-ring_bytes // (2 * n * k)))
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device=device) * 0.02 for _ in range(copies)]
    h, residual = (torch.randn(1, k, dtype=torch.bfloat16, device=device) for _ in range(2))
    norm_weight = torch.rand(k, dtype=torch.bfloat16, device=device) + 0.5

    def separate(x, w):  # FlashInfer's add + norm works in place (the values drift; the time does not)
        return gemv(fused.add_rmsnorm(x, residual, norm_weight, eps)[0], w)

    def one(x, w, **tile):
        return norm_gemv(x, residual, norm_weight, eps, w, **tile)

    row = {"shape": shape, "matmul": name, "n": n, "k": k, "blocks": list(gemv_blocks(n, k, normed=True)),
           "separate_us": ring_us(separate, h, weights, calls), "fused_us": ring_us(one, h, weights, calls),
           "gemv_alone_us": ring_us(gemv, h, weights, calls)}
    if sweep:
        block_k = gemv_blocks(n, k, normed=True)[1]  # the whole row: only the rows per program vary
        tiles = [((r, block_k), nw) for r in (1, 2, 4, 8, 16) for nw in (4, 8) if r * block_k <= 16384]
        tried = [{"blocks": list(blocks), "num_warps": warps,
                  "us": ring_us(lambda x, w, b=blocks, nw=warps: one(x, w, blocks=b, num_warps=nw), h, weights, calls)}
                 for blocks, warps in tiles]
        row["sweep"] = sorted(tried, key=lambda t: t["us"])
    print(f"  {shape} add + RMSNorm + {name} [{n} x {k}]: separate {row['separate_us']:.2f} us, fused "
          f"{row['fused_us']:.2f} us (the GEMV alone {row['gemv_alone_us']:.2f})"
          + (f", best of sweep {row['sweep'][0]}" if sweep else ""))
    return row


# The fused decode kernel's tiles timed by --sweep: (piece size in tokens, BLOCK_N, warps).
ATTENTION_SWEEP = [(split, block, warps) for split in (16, 32, 64, 128, 256) for block in (16, 32, 64)
                   for warps in (2, 4, 8) if split % block == 0]


def bench_decode_attention(device: str, calls: int, sweep: bool,
                           shapes: tuple[str, ...] = ("qwen3-0.6b", "llama-3.1-8b")) -> list[dict]:
    """Per layer, one decode batch (``bs`` rows of ``context`` tokens each, the new one
    included): FlashInfer's captured decode (:class:`FlashInferDecodeGraphAttention`: append +
    decode + merge) against :func:`append_decode_attention`, µs per call in a graph, with the
    heads of ``shapes`` (Qwen3-0.6B: 16 query heads over 8 KV heads; Llama-3.1-8B: 32 over 8;
    Qwen3-30B-A3B: 32 over 4; head_dim 128). With ``sweep``, the tiles of the first shape at 1
    and 4 rows."""
    rows = []
    cases = [(bs, ctx) for bs in (1, 2, 4, 8, 16) for ctx in (128, 512, 2048, 8192, 32768) if bs * ctx <= 262144]
    for shape in shapes:
        for bs, ctx in cases:
            row = decode_attention_case(shape, bs, ctx, device, calls, sweep and shape == shapes[0] and bs in (1, 4))
            rows.append(row)
            best = f", best of sweep {row['sweep'][0]}" if "sweep" in row else ""
            print(f"  {shape} decode attention bs={bs} context {ctx}: FlashInfer {row['flashinfer_us']:.2f} us, "
                  f"fused {row['fused_us']:.2f} us{best}")
    return rows


def decode_attention_case(shape: str, bs: int, ctx: int, device: str, calls: int, sweep: bool,
                          page_size: int = 16, ring_bytes: int = 256 << 20) -> dict:
    """One row of :func:`bench_decode_attention`: each call attends on another layer of a pool of
    at least ``ring_bytes`` (at most 256 layers)."""
    import functools

    from minisgl.attention.fused_decode import AppendDecodeWorkspace, append_decode_attention
    from minisgl.attention.graph_attention import FlashInferDecodeGraphAttention
    from minisgl.attention.metadata import BatchMetadata
    from minisgl.kvcache.paged_pool import PagedKVPool

    c = SHAPES[shape]
    hq, hkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    pages = -(-ctx // page_size)
    layers = max(2, min(256, -(-ring_bytes // (2 * bs * pages * page_size * hkv * d * 2))))
    pool = PagedKVPool(layers, bs * pages, page_size, hkv, d, torch.bfloat16, device)
    meta = BatchMetadata.from_requests([range(r * pages, (r + 1) * pages) for r in range(bs)],
                                       [ctx - 1] * bs, [1] * bs, page_size)
    qkv = torch.randn(bs, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device=device)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(bs, hq, d), k.view(bs, hkv, d), v.view(bs, hkv, d)
    n_calls = max(calls, layers)
    flashinfer = FlashInferDecodeGraphAttention(pool, hq, bs, pages, [bs])
    flashinfer.prepare(meta)
    indptr, indices, last = (t.to(device) for t in (meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len))
    workspace = AppendDecodeWorkspace(bs, hq, hkv, d, torch.device(device))

    def fused(i: int, **tile) -> object:
        return append_decode_attention(q, k, v, pool.k[i % layers], pool.v[i % layers], indptr, indices, last,
                                       workspace, **tile)

    row = {"shape": shape, "batch_size": bs, "context": ctx, "layers_in_ring": layers,
           "flashinfer_us": graph_us(lambda i: flashinfer.forward(q, k, v, i % layers), n_calls),
           "fused_us": graph_us(fused, n_calls)}
    if sweep:
        tried = [{"split_min": split, "block_n": block, "num_warps": warps,
                  "us": graph_us(functools.partial(fused, split_min=split, block_n=block, num_warps=warps), n_calls)}
                 for split, block, warps in ATTENTION_SWEEP]
        row["sweep"] = sorted(tried, key=lambda t: t["us"])
    return row


DEFAULT_OUT = "benchmarks/results/decode_kernels_gpu.json"


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("kernels", __doc__, device=False, seed=False, threads=False, out=DEFAULT_OUT)
    parser.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    parser.add_argument("--calls", type=int, default=50, help="calls per captured graph")
    parser.add_argument("--ring-mb", type=int, default=512, help="weight copies per matmul, at least this many MB")
    parser.add_argument("--sweep", action="store_true", help="also time a sweep of GEMV tiles")
    parser.add_argument("--sweep-parts", default="matmuls,swiglu,norm",
                        help="with --sweep: which GEMVs' tiles to sweep (comma-separated: matmuls, swiglu, norm)")
    parser.add_argument("--attention-sweep", action="store_true", help="also time a sweep of the fused decode "
                        "attention's tiles (for the first of --attention-shapes)")
    parser.add_argument("--attention-shapes", default="qwen3-0.6b,llama-3.1-8b",
                        help="whose heads the decode attention is timed with (comma-separated)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks kernels needs a CUDA device (the kernels are Triton and FlashInfer)")
    device = "cuda"
    parts = set(args.sweep_parts.split(","))
    if not parts <= {"matmuls", "swiglu", "norm"}:
        raise SystemExit(f"--sweep-parts takes matmuls, swiglu and/or norm, not {args.sweep_parts!r}")
    results: dict = {"copy_bandwidth_bytes_s": copy_bandwidth(device), "matmuls": []}
    for shape in args.shapes.split(","):
        results["matmuls"] += bench_matmuls(shape, device, args.calls, args.ring_mb << 20,
                                            args.sweep and "matmuls" in parts)
    results["qk_norm_rope"] = bench_qk_norm_rope(device, args.calls)
    results["swiglu_down"] = [bench_swiglu_down(shape, device, args.calls, args.ring_mb << 20,
                                                args.sweep and "swiglu" in parts)
                              for shape in args.shapes.split(",") if "num_experts" not in SHAPES[shape]]
    results["norm_gemv"] = [row for shape in args.shapes.split(",")
                            for row in bench_norm_gemv(shape, device, args.calls, args.ring_mb << 20,
                                                       args.sweep and "norm" in parts)]
    attention_shapes = tuple(args.attention_shapes.split(","))
    results["decode_attention"] = bench_decode_attention(device, args.calls, args.attention_sweep, attention_shapes)
    config = {"shapes": args.shapes.split(","), "attention_shapes": list(attention_shapes),
              "calls_per_graph": args.calls, "ring_mb": args.ring_mb,
              "sweep": args.sweep, "sweep_parts": sorted(parts) if args.sweep else [],
              "attention_sweep": args.attention_sweep, "dtype": "bfloat16", "rows": 1}
    print(f"wrote {write_result(args.out or DEFAULT_OUT, 'kernels', config, results)}")


if __name__ == "__main__":
    main()
