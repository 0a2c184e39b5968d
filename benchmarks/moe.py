"""``python -m benchmarks moe``: lesson 11's mixture-of-experts layer on the Qwen3-30B-A3B shape.

1. **The MoE layer alone** over batch sizes (default 1 to 256): the fused two-kernel path
   (:mod:`minisgl.layers.fused_moe`) timed inside a CUDA graph, the reference one-expert-at-a-time
   loop timed eagerly (it syncs with the host, so no graph can hold it), and the fused path's
   share of its **bytes bound**: the weights of the experts the step actually touches (random
   routing: ``E * (1 - (1 - k/E)^T)`` experts on average at ``T`` tokens) plus the activations,
   over the measured copy bandwidth.
2. With ``--decode``: **bs=1 decode** of the whole model (random weights, ~61 GB in bf16, CUDA
   graphs on) in ms per token, against the roofline of the bytes one step reads: attention, the
   router and the top-k experts of every layer, one embedding row, the final norm and the LM
   head, and the KV of the context.
3. With ``--parallel N`` (N GPUs): **one GPU against TP=N against EP=N** on the whole model, one
   engine after the other in the same run: bs=1 decode ms/token (CUDA graphs on, the fused path
   on every rank) and the offline yardstick (``--yardstick-requests`` requests, lengths
   ``--yardstick-len``), with the all-reduce's measured time and its share of a bs=1 step
   (``2 * layers + 1`` all-reduces per step, of ``[1, hidden]``; the rest is each rank's own work).
4. With ``--latency``: what a launch costs at bs=1 inside a CUDA graph, a one-program kernel
   that moves one number (the floor), against the decode router alone and with its pre-norm
   step: how much of the router's time is its own chain of dependent steps.

The offline yardstick on this shape against Hugging Face runs in ``python -m benchmarks offline
--shape qwen3-30b-a3b``. Results: ``benchmarks/results/moe_<device>.json``. Needs a CUDA GPU with
Triton.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.kernels import graph_us
from benchmarks.offline import SHAPES
from benchmarks.overlap import copy_bandwidth, decode_ms_per_token
from minisgl.layers import fused_moe as fused_module
from minisgl.layers.decode_kernels import PDL_NAMES, pdl_mode
from minisgl.layers.fused_moe import Tiles, fused_moe, fused_moe_gemv
from minisgl.layers.moe import reference_moe

QWEN3_30B_A3B = SHAPES["qwen3-30b-a3b"]

if fused_module.triton is not None:
    import triton.language as tl

    @fused_module.triton.jit
    def _one_number_kernel(x_ptr, y_ptr):
        """The least a launch can do: one program loads one number and stores it plus one."""
        tl.store(y_ptr, tl.load(x_ptr) + 1.0)


def layer_inputs(tokens: int, seed: int = 0, shape: dict = QWEN3_30B_A3B) -> tuple[torch.Tensor, ...]:
    """``x, gate_up_proj, down_proj, weights, ids`` of one MoE layer of ``shape`` (bf16, random
    weights, softmax routing over random logits, renormalised top-k)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, k, h, i = shape["num_experts"], shape["num_experts_per_tok"], shape["hidden_size"], shape["moe_intermediate_size"]
    x = torch.randn(tokens, h, device="cuda", generator=g).bfloat16()
    w1 = (torch.randn(e, 2 * i, h, device="cuda", generator=g) * h ** -0.5).bfloat16()
    w2 = (torch.randn(e, h, i, device="cuda", generator=g) * i ** -0.5).bfloat16()
    weights, ids = torch.randn(tokens, e, device="cuda", generator=g).softmax(-1).topk(k, dim=-1)
    return x, w1, w2, (weights / weights.sum(-1, keepdim=True)).bfloat16(), ids


def layer_bytes(tokens: int, ids: torch.Tensor, shape: dict = QWEN3_30B_A3B) -> int:
    """Bytes the layer must move: the touched experts' weights, ``x`` in and the output out (bf16)."""
    h, i = shape["hidden_size"], shape["moe_intermediate_size"]
    touched = int(ids.unique().numel())
    return touched * 3 * h * i * 2 + 2 * tokens * h * 2


def eager_ms(fn, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def layer_sweep(batch_sizes: list[int], bandwidth: float, copies: int, gemv_up_to: int = 16) -> list[dict]:
    """Per batch size: fused µs in a graph (``copies`` layers' weights in turn, so none comes
    from the L2 cache) as the layer runs it (``path="auto"``), with the grouped and (up to
    ``gemv_up_to`` tokens) the matrix-vector forms side by side; reference µs eagerly; and the
    fused path's share of its bytes bound."""
    rows = []
    layers = [layer_inputs(1, seed=c) for c in range(copies)]  # distinct weights per call
    for bs in batch_sizes:
        x, _, _, weights, ids = layer_inputs(bs, seed=1000 + bs)

        def fused(c: int, path: str, x=x, weights=weights, ids=ids) -> torch.Tensor:
            return fused_moe(x, layers[c % copies][1], layers[c % copies][2], weights, ids, path=path)

        def reference(x=x, weights=weights, ids=ids) -> torch.Tensor:
            return reference_moe(x, layers[0][1], layers[0][2], weights, ids)

        forms = {"grouped_us": graph_us(functools.partial(fused, path="grouped"), copies)}
        if bs <= gemv_up_to:
            forms["gemv_us"] = graph_us(functools.partial(fused, path="gemv"), copies)
        ref_us = eager_ms(reference, calls=10) * 1e3
        nbytes = layer_bytes(bs, ids)
        bound_us = nbytes / bandwidth * 1e6
        row = {"batch_size": bs, "experts_touched": int(ids.unique().numel()), "bytes": nbytes, **forms,
               "reference_us": ref_us, "bytes_bound_us": bound_us}
        set_auto_path(row, fused_module.GEMV_MAX_TOKENS)
        rows.append(row)
        both = f" (grouped {forms['grouped_us']:.1f}, gemv {forms['gemv_us']:.1f})" if "gemv_us" in forms else ""
        print(f"bs={bs:4d}: {row['experts_touched']:3d} experts, fused {row['fused_us']:8.1f} µs{both} "
              f"({row['fraction_of_bytes_bound']:.0%} of the bytes bound {bound_us:.1f} µs), "
              f"reference {ref_us:9.1f} µs ({row['fused_speedup_vs_reference']:.1f}x)", flush=True)
    return rows


def set_auto_path(row: dict, gemv_max_tokens: int) -> None:
    """Fill in a layer row's ``path`` (what ``path="auto"`` runs at its batch size), its
    ``fused_us`` (that form's time) and the ratios derived from it."""
    row["path"] = "gemv" if row["batch_size"] <= gemv_max_tokens and "gemv_us" in row else "grouped"
    row["fused_us"] = row[f"{row['path']}_us"]
    row["fraction_of_bytes_bound"] = row["bytes_bound_us"] / row["fused_us"]
    row["fused_speedup_vs_reference"] = row["reference_us"] / row["fused_us"]


# Tiles of at least 1,024 and at most 8,192 weights (a row or a whole input per step included).
GEMV_TILE_CANDIDATES = [Tiles(n, k, w, 3) for n in (1, 2, 4, 8, 16, 32) for k in (64, 128, 256, 512, 1024, 2048)
                        if 1024 <= n * k <= 8192 for w in (2, 4)]
ROUTER_TILE_CANDIDATES = [Tiles(n, 2048, w) for n in (1, 2, 4) for w in (1, 2, 4)]


def gemv_tile_sweep(bandwidth: float, copies: int, tokens: int = 1) -> list[dict]:
    """The matrix-vector path at ``tokens`` tokens over tile choices, one kernel's tiles varied at
    a time (the other at its default): µs in a graph and the share of the layer's bytes bound."""
    layers = [layer_inputs(1, seed=c) for c in range(copies)]
    x, _, _, weights, ids = layer_inputs(tokens, seed=1000 + tokens)
    bound_us = layer_bytes(tokens, ids) / bandwidth * 1e6
    rows = []
    for kernel in ("gate_up", "down"):
        for tiles in GEMV_TILE_CANDIDATES:
            chosen = {f"{kernel}_tiles": tiles}

            def run(c: int, chosen=chosen) -> torch.Tensor:
                return fused_moe_gemv(x, layers[c % copies][1], layers[c % copies][2], weights, ids, **chosen)

            us = graph_us(run, copies)
            rows.append({"kernel": kernel, "tiles": dataclasses.asdict(tiles), "us": us,
                         "fraction_of_bytes_bound": bound_us / us})
        best = best_tiles(rows, kernel)
        print(f"gemv {kernel} tiles at bs={tokens}: best {best['tiles']} {best['us']:.1f} µs "
              f"({best['fraction_of_bytes_bound']:.0%} of the bytes bound)", flush=True)
    return rows


def router_sweep(copies: int, tokens: int = 1) -> list[dict]:
    """The decode router (:func:`~minisgl.layers.fused_moe.route`: logits, softmax and top-k in
    one launch) at ``tokens`` tokens over tile choices: µs in a CUDA graph, ``copies`` layers'
    router weights in turn. Sets ``ROUTER_TILES`` to the fastest."""
    shape = QWEN3_30B_A3B
    g = torch.Generator("cuda").manual_seed(0)
    routers = [(torch.randn(shape["num_experts"], shape["hidden_size"], device="cuda", generator=g) * 0.02).bfloat16()
               for _ in range(copies)]
    x = torch.randn(tokens, shape["hidden_size"], device="cuda", generator=g).bfloat16()
    rows = []
    for tiles in ROUTER_TILE_CANDIDATES:
        def run(c: int, tiles=tiles) -> tuple[torch.Tensor, torch.Tensor]:
            return fused_module.route(x, routers[c % copies], shape["num_experts_per_tok"], True, tiles=tiles)

        rows.append({"tiles": dataclasses.asdict(tiles), "us": graph_us(run, copies)})
    best = min(rows, key=lambda r: r["us"])
    fused_module.ROUTER_TILES = Tiles(**best["tiles"])
    times = ", ".join(f"{r['us']:.1f}" for r in rows)
    print(f"router at bs={tokens}: best {best['tiles']} {best['us']:.1f} µs (of {times})", flush=True)
    return rows


def best_tiles(sweep: list[dict], kernel: str) -> dict:
    """The fastest row of ``kernel`` (``"gate_up"`` or ``"down"``) in a :func:`gemv_tile_sweep`."""
    return min((r for r in sweep if r["kernel"] == kernel), key=lambda r: r["us"])


def use_best_tiles(sweep: list[dict]) -> dict:
    """Make the matrix-vector path run the sweep's fastest tiles (``GEMV_*_TILES``); returns them."""
    chosen = {}
    for kernel in ("gate_up", "down"):
        tiles = best_tiles(sweep, kernel)["tiles"]
        setattr(fused_module, f"GEMV_{kernel.upper()}_TILES", Tiles(**tiles))
        chosen[f"{kernel}_tiles"] = tiles
    return chosen


def kernel_breakdown(tokens: int, copies: int, calls: int = 20) -> dict:
    """Device µs per call of each kernel of the fused layer at ``tokens`` tokens, both forms
    (``torch.profiler`` over ``calls`` eager calls)."""
    from torch.profiler import ProfilerActivity, profile

    layers = [layer_inputs(1, seed=c) for c in range(copies)]
    x, _, _, weights, ids = layer_inputs(tokens, seed=1000 + tokens)
    out = {}
    for path in ("grouped", "gemv"):
        for c in range(2):
            fused_moe(x, layers[c][1], layers[c][2], weights, ids, path=path)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for c in range(calls):
                fused_moe(x, layers[c % copies][1], layers[c % copies][2], weights, ids, path=path)
            torch.cuda.synchronize()
        per_kernel: dict[str, float] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                name = event.name[:60]
                per_kernel[name] = per_kernel.get(name, 0.0) + event.device_time_total / calls
        out[path] = per_kernel
        print(f"{path} at bs={tokens}: " + ", ".join(f"{n} {us:.1f}" for n, us in per_kernel.items()) + " µs", flush=True)
    return out


def latency_bs1(copies: int, calls: int = 48) -> dict:
    """Microseconds per call inside a CUDA graph (``calls`` calls in a row, each waiting for the
    one before unless PDL is on) of: a one-program kernel that loads and stores one number (the
    launch floor), the decode router alone (:func:`~minisgl.layers.fused_moe.route`) and with its
    pre-norm step (:func:`~minisgl.layers.fused_moe.route_normed`) at one token, ``copies``
    layers' router weights in turn. What the router costs above the floor is its own chain of
    dependent steps (loads, the logits' sums, the last arrival's softmax and top-k)."""
    shape = QWEN3_30B_A3B
    g = torch.Generator("cuda").manual_seed(0)
    hidden, experts, k = shape["hidden_size"], shape["num_experts"], shape["num_experts_per_tok"]
    routers = [(torch.randn(experts, hidden, device="cuda", generator=g) * 0.02).bfloat16() for _ in range(copies)]
    h, residual = (torch.randn(1, hidden, device="cuda", generator=g).bfloat16() for _ in range(2))
    norm_weight = torch.ones(hidden, device="cuda").bfloat16()
    numbers = torch.zeros(2, device="cuda")
    out = {
        "floor_one_number_kernel_us": graph_us(lambda c: _one_number_kernel[(1,)](numbers, numbers[1:]), calls),
        "router_us": graph_us(lambda c: fused_module.route(h, routers[c % copies], k, True), calls),
        "router_with_pre_norm_us": graph_us(
            lambda c: fused_module.route_normed(h, residual, norm_weight, 1e-6, routers[c % copies], k, True), calls),
        "calls_per_graph": calls,
    }
    print(f"inside a graph at bs=1: a one-number kernel {out['floor_one_number_kernel_us']:.2f} µs, the router "
          f"{out['router_us']:.2f} µs, with its pre-norm step {out['router_with_pre_norm_us']:.2f} µs", flush=True)
    return out


def choose_gemv(rows: list[dict], sweep: list[dict]) -> dict:
    """Set the matrix-vector path's tiles to the sweep's best and ``GEMV_MAX_TOKENS`` to the
    batch sizes, from 1 up, where it beat the grouped path in the layer sweep (0: never)."""
    choice = use_best_tiles(sweep)
    limit = 0
    for row in sorted(rows, key=lambda r: r["batch_size"]):
        if "gemv_us" not in row or row["gemv_us"] >= row["grouped_us"]:
            break
        limit = row["batch_size"]
    fused_module.GEMV_MAX_TOKENS = limit
    choice["gemv_max_tokens"] = limit
    for row in rows:  # what path="auto" runs from now on (the decode below, the lesson's engine)
        set_auto_path(row, limit)
    print(f"chosen: the matrix-vector path up to {limit} tokens, tiles {choice}", flush=True)
    return choice


def step_bytes(shape: dict, context: int) -> int:
    """Bytes one bs=1 decode step of ``shape`` reads (bf16): per layer the attention projections,
    the q/k norms and two RMSNorms, the router and the top-k experts; one embedding row; the final
    norm and the LM head; ``context`` tokens of KV."""
    h, d, k = shape["hidden_size"], shape["head_dim"], shape["num_experts_per_tok"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    layer = h * (q + 2 * kv) + q * h + 2 * d + 2 * h + shape["num_experts"] * h + k * 3 * h * shape["moe_intermediate_size"]
    kv_bytes = context * shape["num_hidden_layers"] * 2 * kv * 2
    return 2 * (shape["num_hidden_layers"] * layer + h + h + shape["vocab_size"] * h) + kv_bytes


def decode_run(bandwidth: float, tokens: int) -> dict:
    """bs=1 ms/token of the whole model with graphs, and its roofline."""
    from benchmarks.offline import shape_checkpoint
    from minisgl import LLM

    llm = LLM(shape_checkpoint("qwen3-30b-a3b", QWEN3_30B_A3B), device="cuda", dtype=torch.bfloat16, dummy_weights=True,
              num_pages=256, max_running=4,
              cuda_graph_max_bs=4, max_seq_len=2048)
    runs = [decode_ms_per_token(llm, "cuda", tokens, QWEN3_30B_A3B["vocab_size"]) for _ in range(3)]
    ms = statistics.median(runs)
    nbytes = step_bytes(QWEN3_30B_A3B, 128 + tokens // 2)
    roofline = nbytes / bandwidth * 1e3
    params = sum(p.numel() for p in llm.model.parameters())
    print(f"bs=1 decode: {ms:.2f} ms/token (runs {', '.join(f'{r:.2f}' for r in runs)}); roofline {roofline:.2f} ms "
          f"({nbytes / 1e9:.2f} GB per step of {params * 2 / 1e9:.1f} GB of weights): {ms / roofline:.2f}x the roofline")
    replays = sum(llm.engine.runner.stats.replays.values())
    from benchmarks.graphs import kernels_per_decode_step

    kernels = kernels_per_decode_step(llm, steps=10, top_names=3)
    print(f"a bs=1 step runs {kernels['kernels_per_step']:.0f} kernels: " + ", ".join(
        f"{kind} {v['us_per_step']:.0f} µs" for kind, v in list(kernels["by_kind"].items())[:6]), flush=True)
    load = expert_load(llm)
    llm.close()
    return {"ms_per_token": ms, "runs_ms": runs, "bytes_per_step": nbytes, "roofline_ms": roofline,
            "times_roofline": ms / roofline, "weights_bytes": params * 2, "graph_replays": replays,
            "kernels": kernels, "expert_load": load}


def expert_load(llm, requests: int = 64, lengths: tuple[int, int] = (100, 512), new_tokens: int = 16,
                seed: int = 0) -> dict:
    """The expert-load histogram of a workload: every token's router choices in every layer (the
    yardstick's kind of prompts: random token ids of ``lengths``, then ``new_tokens`` generated),
    counted by forward pre-hooks that rerun the router on the layer's input. The hooks run only
    in eager forwards, so CUDA graphs are switched off while they count."""
    from benchmarks.offline import make_workload
    from minisgl import SamplingParams
    from minisgl.layers.moe import SparseMoE

    layers = [m for m in llm.model.modules() if isinstance(m, SparseMoE)]
    experts = layers[0].gate.weight.shape[0]
    counts = torch.zeros(len(layers), experts, dtype=torch.int64, device=layers[0].gate.weight.device)

    def counter(i: int):
        def hook(module, args) -> None:
            _, ids = module.gate(args[0])
            counts[i].scatter_add_(0, ids.reshape(-1), torch.ones_like(ids.reshape(-1)))
        return hook

    handles = [m.register_forward_pre_hook(counter(i)) for i, m in enumerate(layers)]
    runner = llm.engine.runner
    saved_max_bs, runner.max_bs = runner.max_bs, 0  # every decode batch runs eagerly
    try:
        prompts, _ = make_workload(requests, *lengths, llm.config.vocab_size, seed)
        llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True), progress=False)
    finally:
        for h in handles:
            h.remove()
        runner.max_bs = saved_max_bs
    per_layer = counts.cpu()
    mean = per_layer.float().mean(1, keepdim=True)
    busiest = (per_layer.float().max(1).values / mean.squeeze(1))
    print(f"expert load over {int(per_layer[0].sum()) // llm.config.num_experts_per_tok} tokens: busiest expert "
          f"{busiest.median():.2f}x its layer's mean (median over layers; max {busiest.max():.2f}x)", flush=True)
    return {"requests": requests, "prompt_lengths": list(lengths), "new_tokens": new_tokens,
            "counts": per_layer.tolist(), "busiest_over_mean": busiest.tolist(),
            "note": "random weights: the router is untrained, so this is the load of random routing"}


def parallel_run(gpus: int, tokens: int, yardstick_requests: int, yardstick_len: str, seed: int) -> dict:
    """One GPU, TP=``gpus`` and EP=``gpus`` on the whole 30B-A3B shape: bs=1 decode and the
    yardstick of each, one engine at a time; the all-reduce's time and share of a bs=1 step."""
    from benchmarks.offline import empty_cache, make_workload, run_yardstick, shape_checkpoint
    from benchmarks.tp import measure_all_reduce
    from minisgl import LLM

    path = shape_checkpoint("qwen3-30b-a3b", QWEN3_30B_A3B)
    lo, hi = (int(v) for v in yardstick_len.split(","))
    prompts, out_lens = make_workload(yardstick_requests, lo, hi, QWEN3_30B_A3B["vocab_size"], seed)
    sides = {"one_gpu": {}, f"tp{gpus}": {"tp_size": gpus}, f"ep{gpus}": {"tp_size": gpus, "ep_size": gpus}}
    out: dict = {}
    for key, settings in sides.items():
        llm = LLM(path, device="cuda", dtype=torch.bfloat16, dummy_weights=True, max_running=256,
                  max_seq_len=2 * hi + 64, **settings)
        runs = [decode_ms_per_token(llm, "cuda", tokens, QWEN3_30B_A3B["vocab_size"]) for _ in range(3)]
        entry = {"settings": settings, "decode_bs1_ms": statistics.median(runs), "decode_runs_ms": runs}
        print(f"{key}: bs=1 decode {entry['decode_bs1_ms']:.2f} ms/token (runs {', '.join(f'{r:.2f}' for r in runs)})",
              flush=True)
        if yardstick_requests:
            entry["yardstick"] = run_yardstick(llm, prompts, out_lens, "cuda")
        out[key] = entry
        llm.close()
        del llm
        empty_cache("cuda")
    rows = measure_all_reduce("cuda", torch.bfloat16, QWEN3_30B_A3B["hidden_size"], gpus, batch_sizes=(1,))
    per_step = 2 * QWEN3_30B_A3B["num_hidden_layers"] + 1
    best_us = min(v for k, v in rows[0].items() if k.endswith("graph_us"))
    for key in sides:
        if key != "one_gpu":
            share = per_step * best_us / 1e3 / out[key]["decode_bs1_ms"]
            out[key]["all_reduce_share_bs1"] = share
            out[key]["speedup_bs1_vs_one_gpu"] = out["one_gpu"]["decode_bs1_ms"] / out[key]["decode_bs1_ms"]
            if yardstick_requests:
                out[key]["yardstick_vs_one_gpu"] = (out[key]["yardstick"]["output_tok_s"]
                                                    / out["one_gpu"]["yardstick"]["output_tok_s"])
            print(f"{key}: {out[key]['speedup_bs1_vs_one_gpu']:.2f}x one GPU at bs=1; all-reduces "
                  f"{per_step} x {best_us:.1f} us = {share:.0%} of its step", flush=True)
    return {"sides": out, "all_reduce": rows, "all_reduces_per_step": per_step, "all_reduce_us_in_graph": best_us}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("moe", __doc__, threads=False, out="benchmarks/results/moe_<device>.json")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--copies", type=int, default=8, help="layers' weights cycled inside the graph (beats the L2 cache)")
    parser.add_argument("--decode", action="store_true", help="also bs=1 decode of the whole model (~61 GB)")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--parallel", type=int, default=0, help="GPUs for one GPU vs TP vs EP (0: skip)")
    parser.add_argument("--yardstick-requests", type=int, default=128, help="with --parallel (0: skip)")
    parser.add_argument("--yardstick-len", default="100,1024")
    parser.add_argument("--skip-layer", action="store_true", help="skip the layer sweep")
    parser.add_argument("--gemv-tiles", action="store_true", help="also the bs=1 matrix-vector path over tile choices")
    parser.add_argument("--latency", action="store_true",
                        help="also the launch floor and the router alone inside a graph at bs=1")
    args = parser.parse_args(argv)
    if not args.device.startswith("cuda"):
        raise SystemExit("python -m benchmarks moe needs a CUDA GPU (the fused path is Triton)")
    bandwidth = copy_bandwidth(args.device)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    results: dict = {"copy_bandwidth_bytes_s": bandwidth}
    if not args.skip_layer:
        if args.gemv_tiles:  # first: the layer sweep's matrix-vector path runs the best tiles
            results["gemv_tiles_bs1"] = gemv_tile_sweep(bandwidth, args.copies)
            use_best_tiles(results["gemv_tiles_bs1"])
            results["router_tiles_bs1"] = router_sweep(args.copies)
        results["layer"] = layer_sweep([int(b) for b in args.batch_sizes.split(",")], bandwidth, args.copies)
        results["kernels_bs1"] = kernel_breakdown(1, args.copies)
        if args.gemv_tiles:
            results["gemv_choice"] = choose_gemv(results["layer"], results["gemv_tiles_bs1"])
    if args.latency:
        results["latency_bs1"] = latency_bs1(args.copies)
    torch.cuda.empty_cache()
    if args.decode:
        results["decode_bs1"] = decode_run(bandwidth, args.decode_tokens)
    if args.parallel:
        if torch.cuda.device_count() < args.parallel:
            raise SystemExit(f"--parallel {args.parallel} needs {args.parallel} GPUs")
        results["parallel"] = parallel_run(args.parallel, args.decode_tokens, args.yardstick_requests,
                                           args.yardstick_len, args.seed)
    config = {"shape": "qwen3-30b-a3b", "model_config": QWEN3_30B_A3B, "dtype": "bfloat16",
              "routing": "random logits, softmax, top-8, renormalised", "copies": args.copies,
              "decode": args.decode, "decode_tokens": args.decode_tokens, "parallel": args.parallel,
              "yardstick_requests": args.yardstick_requests, "yardstick_len": args.yardstick_len, "seed": args.seed,
              "pdl": PDL_NAMES[pdl_mode()]}  # MINISGL_PDL: the decode kernels' programmatic dependent launch
    out = args.out or "benchmarks/results/moe_gpu.json"
    print(f"wrote {write_result(out, 'moe', config, results)}")


if __name__ == "__main__":
    main()
