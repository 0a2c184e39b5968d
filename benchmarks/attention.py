"""Decode-attention micro-benchmark: time and achieved KV bandwidth vs batch size and context.

    python -m benchmarks attention --out benchmarks/results/attention_decode_h200.json

Decode attention reads every cached K and V once and does little arithmetic per byte, so its
speed limit is memory bandwidth. We report ``KV bytes read / time`` next to a device-to-device
copy measured in the same run (the practical HBM ceiling). Shapes: one layer of Qwen3-0.6B
(16 query heads, 8 KV heads, head_dim 128, bf16), page size 16.
"""

from __future__ import annotations

import random

import torch

from benchmarks.cli import benchmark_parser, write_result
from minisgl.attention.factory import make_paged_backend
from minisgl.attention.metadata import BatchMetadata
from minisgl.kvcache.paged_pool import PagedKVPool


def time_ms(fn, warmup: int = 5, iters: int = 30) -> float:
    """Median milliseconds of ``fn()`` timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (reads + writes counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms / 1e3)


def bench_case(backend_kind: str, batch: int, context: int, heads: tuple[int, int, int], page_size: int) -> dict:
    hq, hkv, d = heads
    pages_per_req = -(-context // page_size)
    num_pages = batch * pages_per_req
    pool = PagedKVPool(1, num_pages, page_size, hkv, d, torch.bfloat16, "cuda")
    pool.k[0].normal_()
    pool.v[0].normal_()
    order = list(range(num_pages))
    random.Random(0).shuffle(order)  # pages of one request scattered over the pool
    page_lists = [order[i * pages_per_req:(i + 1) * pages_per_req] for i in range(batch)]
    meta = BatchMetadata.from_requests(page_lists, [context - 1] * batch, [1] * batch, page_size)
    backend = make_paged_backend(pool, hq, backend_kind)
    backend.plan(meta)
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    ms = time_ms(lambda: backend.forward(q, k, v, 0), iters=10 if backend_kind == "reference" else 50)
    kv_bytes = 2 * batch * context * hkv * d * 2
    return {"backend": backend_kind, "batch": batch, "context": context, "ms": ms, "kv_bytes": kv_bytes,
            "bandwidth_tb_s": kv_bytes / (ms / 1e3) / 1e12}


DEFAULT_OUT = "benchmarks/results/attention_decode.json"


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("attention", __doc__, device=False, seed=False, threads=False, out=DEFAULT_OUT)
    parser.add_argument("--batches", default="1,8,32,64,128")
    parser.add_argument("--contexts", default="512,1024,2048,4096,8192")
    parser.add_argument("--reference-max-batch", type=int, default=32, help="the torch reference is slow: cap its batch")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the attention micro-benchmark needs a CUDA GPU")
    heads, page_size = (16, 8, 128), 16
    hbm = copy_bandwidth()
    rows = []
    for kind in ("flashinfer", "triton", "reference"):
        for batch in map(int, args.batches.split(",")):
            if kind == "reference" and batch > args.reference_max_batch:  # too slow to bother
                continue
            for context in map(int, args.contexts.split(",")):
                row = bench_case(kind, batch, context, heads, page_size)
                row["fraction_of_copy_bw"] = row["bandwidth_tb_s"] * 1e12 / hbm
                rows.append(row)
                print(f"{kind:10s} bs={batch:4d} ctx={context:5d} {row['ms']:8.3f} ms  "
                      f"{row['bandwidth_tb_s']:6.2f} TB/s ({row['fraction_of_copy_bw']:.0%} of copy)", flush=True)
                torch.cuda.empty_cache()
    config = {"num_qo_heads": heads[0], "num_kv_heads": heads[1], "head_dim": heads[2], "dtype": "bfloat16",
              "page_size": page_size, "layers": 1, "shape": "Qwen3-0.6B attention layer"}
    path = write_result(args.out or DEFAULT_OUT, "attention_decode", config, {"copy_bandwidth_tb_s": hbm / 1e12, "rows": rows})
    print(f"copy bandwidth {hbm / 1e12:.2f} TB/s; wrote {path}")


if __name__ == "__main__":
    main()
