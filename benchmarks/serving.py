"""The serving benchmark: requests arrive over time at an OpenAI-compatible server, and every
request's latencies are measured the way the field measures them (sglang's ``bench_serving``
definitions).

Against any server that takes token-id prompts on ``/v1/completions`` (ours, sglang, vLLM):

    python -m benchmarks serving --base-url http://127.0.0.1:1919 --request-rate 4,8,inf
    python -m benchmarks serving --base-url URL --workload shared-prefix --max-concurrency 32

With no ``--base-url`` it starts ``python -m minisgl`` itself and runs the whole suite:

    python -m benchmarks serving                       # GPU: Qwen3-0.6B shape, random weights
    python -m benchmarks serving --shape tiny --device cpu --num-prompts 24 --input-len 64 \\
        --output-len 16 --radix-groups 2 --radix-per-group 6 --system-len 256 --question-len 16 \\
        --long-len 1500 --num-long 2 --num-short 24 --short-len 16 --server-arg=--chunked-prefill-size=256 \\
        --more-chunk-sizes 64   # CPU

1. **curve**: the random workload at several request rates (default: 25, 50, 75, 100 and 125%
   of the request throughput the server reaches when every request is sent at once, which is
   measured first), each point with fresh prompts;
2. **radix**: the shared-prefix workload, all at once, with the prefix cache on and off (a second
   server started with ``--no-prefix-cache``);
3. **chunked**: short requests arriving at a steady rate with a few very long prompts among them,
   with chunked prefill on (the default server), off (a server started with
   ``--chunked-prefill-size 0``) and with each of ``--more-chunk-sizes``; what matters is the short
   requests' time to first token.

**Arrivals.** Poisson at ``--request-rate`` requests/s (exponential gaps, a fixed seed), or all at
once (``inf``); ``--max-concurrency`` caps the requests in flight (the rest wait in the client).
A few warm-up requests run first and are not counted.

**Metrics** (per request, from its stream; one server-sent event per token):

- TTFT: from sending the request to its first token;
- ITL: the gaps between consecutive token events;
- TPOT: (E2E − TTFT) / (output tokens − 1), for requests with more than one token;
- E2E: from sending the request to its last event;

each as mean, p50, p90 and p99 in milliseconds; request and token throughput over the run
(from the first request sent to the last answer), with token counts from the server's ``usage``;
concurrency: the mean number of requests in flight (sum of E2E / duration). Requests can carry
a tag (``short``/``long``); then every metric is also given per tag.

Results go to ``benchmarks/results/serving_<shape>_<gpu|cpu>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.cli import write_result

PERCENTILES = (50, 90, 99)
# The suite's request rates, as fractions of the request throughput of an all-at-once burst: from
# a light load to past what the server can keep up with, where the queue (and TTFT) grows.
RATE_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.25)


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: a token-id prompt, how many tokens to generate, a tag."""

    prompt: list[int]
    max_tokens: int
    tag: str = ""


@dataclass
class RequestRecord:
    """What one request did. Times are seconds from the start of the run."""

    tag: str
    sent_s: float
    ok: bool = False
    error: str = ""
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    itl_s: list[float] = field(default_factory=list)
    token_events: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


# ------------------------------------------------------------------------------------------
# Workloads. Random token ids: the speed of a model does not depend on what the tokens say.


def random_requests(n: int, input_len: int, output_len: int, range_ratio: float, vocab: int,
                    seed: int) -> list[RequestSpec]:
    """``n`` prompts; input and output lengths uniform in ``[round(len * range_ratio), len]``
    (``range_ratio`` 1.0: every request exactly ``len``)."""
    rng = random.Random(seed)

    def length(full: int) -> int:
        return rng.randint(max(1, round(full * range_ratio)), full)

    specs = []
    for _ in range(n):
        m, out = length(input_len), length(output_len)
        specs.append(RequestSpec([rng.randrange(vocab) for _ in range(m)], out))
    return specs


def shared_prefix_requests(groups: int, per_group: int, system_len: int, question_len: int, output_len: int,
                           vocab: int, seed: int) -> list[RequestSpec]:
    """``groups * per_group`` prompts; a group's prompts share a ``system_len``-token prefix and
    each adds ``question_len`` tokens of its own. Groups interleave."""
    from benchmarks.radix import shared_prefix_workload

    prompts = shared_prefix_workload(groups, per_group, system_len, question_len, vocab, seed)
    return [RequestSpec(p, output_len) for p in prompts]


def long_and_short_requests(num_short: int, short_len: int, output_len: int, num_long: int, long_len: int,
                            vocab: int, seed: int) -> list[RequestSpec]:
    """``num_short`` short prompts (tag ``short``) with ``num_long`` very long ones (tag ``long``)
    evenly placed among them, the first long one after the first stretch of short ones."""
    rng = random.Random(seed)
    shorts = [RequestSpec([rng.randrange(vocab) for _ in range(short_len)], output_len, "short") for _ in range(num_short)]
    longs = [RequestSpec([rng.randrange(vocab) for _ in range(long_len)], output_len, "long") for _ in range(num_long)]
    specs = list(shorts)
    for i, spec in enumerate(longs):
        specs.insert((i + 1) * num_short // (num_long + 1) + i, spec)
    return specs


def arrival_times(n: int, request_rate: float | None, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent: Poisson arrivals at ``request_rate``
    per second (exponential gaps; the first request at 0), or all at 0 when it is None."""
    if request_rate is None:
        return [0.0] * n
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        now += rng.expovariate(request_rate)
    return times


# ------------------------------------------------------------------------------------------
# The client.


async def _one(client, url: str, model: str, spec: RequestSpec, start: float, record: RequestRecord) -> None:
    """Send ``spec`` as a streaming completion and fill ``record`` from its events."""
    body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    record.sent_s = sent - start
    last = sent
    usage = None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:300].decode(errors='replace')}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage = event["usage"]
                if not event.get("choices"):
                    continue
                if record.token_events == 0:
                    record.ttft_s = now - sent
                else:
                    record.itl_s.append(now - last)
                record.token_events += 1
                last = now
    except Exception as exc:  # a failed request is counted, never the end of the run
        record.error = f"{type(exc).__name__}: {exc}"
        return
    if usage is None:
        record.error = "the stream carried no usage (stream_options.include_usage)"
        return
    record.e2e_s = last - sent
    record.prompt_tokens = usage.get("prompt_tokens", 0)
    record.output_tokens = usage.get("completion_tokens", 0)
    record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    record.ok = record.token_events > 0


async def _run(url: str, model: str, specs: list[RequestSpec], arrivals: list[float], max_concurrency: int | None,
               warmup: list[RequestSpec], headers: dict[str, str]) -> tuple[list[RequestRecord], float]:
    import httpx

    # A fresh connection for every request (localhost: a TCP handshake is ~0.1 ms): a connection
    # kept alive in the pool can be closed by the server (uvicorn: after 5 idle seconds) just as
    # the next request goes out on it, and that request fails with a ReadError.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits, headers=headers) as client:
        for spec in warmup:
            rec = RequestRecord(spec.tag, 0.0)
            await _one(client, url, model, spec, time.perf_counter(), rec)
            if not rec.ok:
                raise RuntimeError(f"the warm-up request failed: {rec.error}")
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        records = [RequestRecord(spec.tag, at) for spec, at in zip(specs, arrivals)]
        start = time.perf_counter()

        async def arrive(spec: RequestSpec, at: float, record: RequestRecord) -> None:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            if gate is None:
                await _one(client, url, model, spec, start, record)
            else:
                async with gate:
                    await _one(client, url, model, spec, start, record)

        await asyncio.gather(*(arrive(s, a, r) for s, a, r in zip(specs, arrivals, records)))
        duration = max((r.sent_s + r.e2e_s for r in records if r.ok), default=time.perf_counter() - start)
    return records, duration


def _stats_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, **{f"p{q}": math.nan for q in PERCENTILES}}
    ms = np.asarray(values) * 1000.0
    return {"mean": float(ms.mean()), **{f"p{q}": float(np.percentile(ms, q)) for q in PERCENTILES}}


def summarize(records: list[RequestRecord], duration: float) -> dict[str, Any]:
    """The metrics of a run (see the module docstring), over the requests that succeeded;
    ``failed`` counts the others. With more than one tag, also ``by_tag``."""
    done = [r for r in records if r.ok]
    out: dict[str, Any] = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration,
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": sum(r.output_tokens for r in done),
        "cached_tokens": sum(r.cached_tokens for r in done),
        "token_events": sum(r.token_events for r in done),  # = output tokens when one event carries one token
        "request_throughput": len(done) / duration,
        "input_throughput": sum(r.prompt_tokens for r in done) / duration,
        "output_throughput": sum(r.output_tokens for r in done) / duration,
        "concurrency": sum(r.e2e_s for r in done) / duration,
        "ttft_ms": _stats_ms([r.ttft_s for r in done]),
        "tpot_ms": _stats_ms([(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]),
        "itl_ms": _stats_ms([gap for r in done for gap in r.itl_s]),
        "e2e_ms": _stats_ms([r.e2e_s for r in done]),
    }
    tags = sorted({r.tag for r in records})
    if len(tags) > 1:
        out["by_tag"] = {tag: summarize([r for r in records if r.tag == tag], duration) for tag in tags}
    errors = sorted({r.error for r in records if not r.ok})
    if errors:
        out["errors"] = errors[:5]
    return out


def served_model(url: str, headers: dict[str, str]) -> str:
    """The first model ``/v1/models`` lists."""
    import httpx

    response = httpx.get(f"{url}/v1/models", headers=headers, timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def run_benchmark(url: str, specs: list[RequestSpec], request_rate: float | None = None,
                  max_concurrency: int | None = None, seed: int = 0, warmup_requests: int = 2,
                  model: str | None = None, api_key: str | None = None) -> dict[str, Any]:
    """Send ``specs`` to the server at ``url`` (arrivals as :func:`arrival_times`, at most
    ``max_concurrency`` in flight) after ``warmup_requests`` short uncounted ones, and return
    :func:`summarize`'s metrics with ``request_rate`` and ``max_concurrency``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    model = model or served_model(url, headers)
    # Warm-up prompts: the first prompt's start reversed, so they share no prefix with the run.
    warmup = [RequestSpec(specs[i % len(specs)].prompt[:32][::-1], 8) for i in range(warmup_requests)]
    arrivals = arrival_times(len(specs), request_rate, seed)
    records, duration = asyncio.run(_run(url, model, specs, arrivals, max_concurrency, warmup, headers))
    metrics = {"request_rate": request_rate, "max_concurrency": max_concurrency, **summarize(records, duration)}
    print(describe(metrics))
    return metrics


def describe(m: dict[str, Any]) -> str:
    rate = "all at once" if m["request_rate"] is None else f"{m['request_rate']:g} req/s"
    if m.get("max_concurrency"):
        rate += f", at most {m['max_concurrency']} in flight"
    return (f"{rate}: {m['completed']} done, {m['failed']} failed in {m['duration_s']:.2f} s; "
            f"{m['request_throughput']:.2f} req/s, {m['output_throughput']:.0f} out tok/s, concurrency {m['concurrency']:.1f}; "
            f"TTFT p50 {m['ttft_ms']['p50']:.1f} p99 {m['ttft_ms']['p99']:.1f} ms; "
            f"TPOT p50 {m['tpot_ms']['p50']:.2f} ms; ITL p99 {m['itl_ms']['p99']:.2f} ms; E2E p50 {m['e2e_ms']['p50']:.0f} ms")


# ------------------------------------------------------------------------------------------
# The command line.


def rates(text: str) -> list[float | None]:
    """argparse type: comma-separated request rates; ``inf`` means all at once."""
    out: list[float | None] = []
    for part in text.split(","):
        value = float(part)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"a request rate must be > 0 (or inf), got {part!r}")
        out.append(None if math.isinf(value) else value)
    return out


def round_rate(rate: float) -> float:
    """Two significant digits: rates that read well in a table."""
    return float(f"{rate:.2g}")


def _workload_config(args, kind: str) -> dict[str, Any]:
    if kind == "random":
        return {"kind": "random", "num_prompts": args.num_prompts, "input_len": args.input_len,
                "output_len": args.output_len, "range_ratio": args.range_ratio}
    if kind == "shared-prefix":
        return {"kind": "shared-prefix", "groups": args.radix_groups, "per_group": args.radix_per_group,
                "system_len": args.system_len, "question_len": args.question_len, "output_len": args.output_len}
    return {"kind": "long+short", "num_short": args.num_short, "short_input_len": args.short_len,
            "output_len": args.short_output_len, "num_long": args.num_long, "long_len": args.long_len}


def _workload(args, kind: str, seed: int) -> list[RequestSpec]:
    if kind == "random":
        return random_requests(args.num_prompts, args.input_len, args.output_len, args.range_ratio, args.vocab_size, seed)
    if kind == "shared-prefix":
        return shared_prefix_requests(args.radix_groups, args.radix_per_group, args.system_len, args.question_len,
                                      args.output_len, args.vocab_size, seed)
    return long_and_short_requests(args.num_short, args.short_len, args.short_output_len, args.num_long,
                                   args.long_len, args.vocab_size, seed)


def run_against(args) -> dict[str, Any]:
    """``--base-url``: the chosen workload at each ``--request-rate``, fresh prompts per rate."""
    points = []
    for i, rate in enumerate(args.request_rate or [None]):
        specs = _workload(args, args.workload, args.seed + 1000 * i)
        points.append(run_benchmark(args.base_url, specs, rate, args.max_concurrency, args.seed,
                                    args.warmup_requests, args.model, args.api_key))
    return {"curve": {"workload": _workload_config(args, args.workload), "points": points}}


def _on_off(on: dict[str, Any], off: dict[str, Any], tag: str | None) -> dict[str, float]:
    """Ratios of a feature on over off: throughput on/off, latencies off/on (> 1: on is better)."""
    a, b = (on["by_tag"][tag], off["by_tag"][tag]) if tag else (on, off)
    prefix = f"{tag}_" if tag else ""
    return {"output_throughput": on["output_throughput"] / off["output_throughput"],
            f"{prefix}ttft_p50": b["ttft_ms"]["p50"] / a["ttft_ms"]["p50"],
            f"{prefix}ttft_p99": b["ttft_ms"]["p99"] / a["ttft_ms"]["p99"],
            f"{prefix}e2e_p50": b["e2e_ms"]["p50"] / a["e2e_ms"]["p50"]}


def run_suite(args) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start our own servers and run the curve, the radix comparison and the chunked comparison;
    return the results and the config."""
    from benchmarks.chunked import DEFAULT_CHUNK
    from benchmarks.offline import SHAPES, benchmark_checkpoint
    from minisgl.testing.server import ServerProcess

    model_dir, dummy, name = benchmark_checkpoint(args.shape)
    args.vocab_size = SHAPES[args.shape]["vocab_size"] if args.shape in SHAPES else 512
    base = (["--dummy-weights"] if dummy else []) + args.server_arg
    kwargs = dict(device=args.device, start_timeout=900, stop_timeout=30)
    results: dict[str, Any] = {}

    def bench(server, specs, rate, seed):
        metrics = run_benchmark(server.url, specs, rate, args.max_concurrency, seed, args.warmup_requests)
        if metrics["failed"]:  # show what the server said about it
            print("-- the server's last output:\n" + server.output()[-4000:])
        return metrics

    radix_specs = _workload(args, "shared-prefix", args.seed)
    chunked_specs = _workload(args, "long+short", args.seed)
    print(f"== default server ({' '.join(base) or 'default settings'})")
    with ServerProcess(model_dir, *base, **kwargs) as server:
        # The radix comparison first, while the cache holds nothing but its own prefixes.
        if "radix" in args.parts:
            radix_on = bench(server, radix_specs, None, args.seed)
        if "chunked" in args.parts:
            chunked_on = bench(server, chunked_specs, args.short_rate, args.seed)
        if "curve" in args.parts:
            burst = bench(server, _workload(args, "random", args.seed), None, args.seed)
            chosen = args.request_rate or [round_rate(f * burst["request_throughput"]) for f in RATE_FRACTIONS]
            points = [bench(server, _workload(args, "random", args.seed + 1000 * (i + 1)), rate, args.seed)
                      for i, rate in enumerate(chosen) if rate is not None]
            results["curve"] = {"workload": _workload_config(args, "random"), "points": points + [burst]}

    if "radix" in args.parts:
        print("== prefix cache off")
        with ServerProcess(model_dir, *base, "--no-prefix-cache", **kwargs) as server:
            radix_off = bench(server, radix_specs, None, args.seed)
        results["radix"] = {"workload": _workload_config(args, "shared-prefix"), "request_rate": None,
                            "on": radix_on, "off": radix_off, "ratios": _on_off(radix_on, radix_off, None)}

    if "chunked" in args.parts:
        print("== chunked prefill off (whole prompts)")
        with ServerProcess(model_dir, *base, "--chunked-prefill-size", "0", **kwargs) as server:
            chunked_off = bench(server, chunked_specs, args.short_rate, args.seed)
        variants = []
        for size in args.more_chunk_sizes:
            print(f"== chunked prefill size {size}")
            with ServerProcess(model_dir, *base, "--chunked-prefill-size", str(size), **kwargs) as server:
                metrics = bench(server, chunked_specs, args.short_rate, args.seed)
            variants.append({"chunked_prefill_size": size, "metrics": metrics,
                             "ratios": _on_off(metrics, chunked_off, "short")})
        results["chunked"] = {"workload": _workload_config(args, "long+short"), "request_rate": args.short_rate,
                              "chunked_prefill_size": _flag(base, "--chunked-prefill-size", DEFAULT_CHUNK),
                              "on": chunked_on, "off": chunked_off, "ratios": _on_off(chunked_on, chunked_off, "short"),
                              "variants": variants}
    if "radix" in results:
        radix = results["radix"]["ratios"]
        print(f"radix on/off: output tok/s {radix['output_throughput']:.2f}×, TTFT p50 {radix['ttft_p50']:.2f}× better")
    if "chunked" in results:
        chunked = results["chunked"]
        for size, ratios in [(chunked["chunked_prefill_size"], chunked["ratios"])] + \
                [(v["chunked_prefill_size"], v["ratios"]) for v in chunked["variants"]]:
            print(f"chunked {size} / whole prompts: short-request TTFT p99 {ratios['short_ttft_p99']:.2f}× better, "
                  f"p50 {ratios['short_ttft_p50']:.2f}×")
    config = {"shape": name, "device": args.device, "dtype": "bfloat16" if args.device.startswith("cuda") else "float32",
              "dummy_weights": dummy, "base_url": None, "server_args": base, "seed": args.seed,
              "warmup_requests": args.warmup_requests}
    return results, config


def _flag(argv: list[str], name: str, default: int) -> int:
    """The value of ``name`` in a server's arguments (the last one wins, as in argparse)."""
    value = default
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = int(argv[i + 1])
        elif arg.startswith(name + "="):
            value = int(arg.split("=", 1)[1])
    return value


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="an OpenAI-compatible server; without it, start our own (the suite)")
    p.add_argument("--model", default=None, help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--workload", default="random", choices=["random", "shared-prefix", "long+short"],
                   help="with --base-url: which workload to send")
    p.add_argument("--request-rate", type=rates, default=None,
                   help="requests/s, comma-separated; inf: all at once (default: inf with --base-url; "
                        "the suite: 25, 50, 75, 100 and 125%% of the all-at-once request throughput)")
    p.add_argument("--max-concurrency", type=int, default=None, help="at most this many requests in flight")
    p.add_argument("--warmup-requests", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=1000, help="with --base-url: token ids are drawn below this")
    g = p.add_argument_group("random workload")
    g.add_argument("--num-prompts", type=int, default=256)
    g.add_argument("--input-len", type=int, default=1024)
    g.add_argument("--output-len", type=int, default=256)
    g.add_argument("--range-ratio", type=float, default=0.5, help="lengths uniform in [len * ratio, len]")
    g = p.add_argument_group("shared-prefix workload (output length: --output-len)")
    g.add_argument("--radix-groups", type=int, default=16)
    g.add_argument("--radix-per-group", type=int, default=16)
    g.add_argument("--system-len", type=int, default=2048)
    g.add_argument("--question-len", type=int, default=128)
    g = p.add_argument_group("long+short workload")
    g.add_argument("--num-short", type=int, default=512)
    g.add_argument("--short-len", type=int, default=128)
    g.add_argument("--short-output-len", type=int, default=32)
    g.add_argument("--num-long", type=int, default=16)
    g.add_argument("--long-len", type=int, default=32768)
    g.add_argument("--short-rate", type=float, default=16.0, help="the suite's arrival rate for this workload")
    g.add_argument("--more-chunk-sizes", type=lambda t: [int(x) for x in t.split(",") if x], default=[2048],
                   help="the suite: also run this workload on a server with each of these chunk sizes (comma-separated)")
    g = p.add_argument_group("the suite (no --base-url)")
    g.add_argument("--shape", default=None, help="qwen3-0.6b (default on CUDA), llama-3.1-8b or tiny (default on CPU)")
    g.add_argument("--device", default=None)
    g.add_argument("--server-arg", action="append", default=[], help="one more argument for every server started")
    g.add_argument("--parts", type=lambda t: set(t.split(",")), default={"curve", "radix", "chunked"},
                   help="which parts of the suite to run (comma-separated; default: curve,radix,chunked)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    if args.base_url:
        results = run_against(args)
        config = {"base_url": args.base_url, "model": args.model, "seed": args.seed,
                  "warmup_requests": args.warmup_requests, "vocab_size": args.vocab_size}
        out = args.out or "benchmarks/results/serving_external.json"
    else:
        import torch

        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        args.shape = args.shape or ("qwen3-0.6b" if args.device.startswith("cuda") else "tiny")
        results, config = run_suite(args)
        kind = "gpu" if args.device.startswith("cuda") else "cpu"
        out = args.out or f"benchmarks/results/serving_{config['shape']}_{kind}.json"
    path = write_result(out, "serving", config, results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
