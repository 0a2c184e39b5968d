"""Lesson 10: the server against the offline engine, on the same burst of requests.

    python -m benchmarks http                     # GPU: 128 requests, Qwen3-0.6B shape, random weights
    python -m benchmarks http --shape tiny --device cpu --num-requests 16 --min-len 16 --max-len 64   # CPU

Both runs in one process, one after the other, with the same engine settings:

1. **offline**: ``LLM.generate`` on every request at once (lesson 4's yardstick);
2. **server**: ``python -m minisgl`` in its own processes, and every request sent at once over
   HTTP to ``/v1/completions`` by an asyncio client, once without streaming and once with
   ``stream=true`` (one server-sent event per token). The clock runs from the first request
   sent to the last answer.

Before its timed run each side serves the whole burst once, untimed (``--no-warmup-burst`` skips
it): a fresh process's first large burst pays first-time costs (memory pools growing, kernels and
graph buckets used for the first time) that the next may not, and without it the server's first
timed burst (no streaming) would be the one to pay them, not the streamed one after it. The
untimed bursts' throughputs are recorded too (``*_warmup``): the two of a side compared tell
whether the first burst paid more.

Output tokens per second of each, and their ratios: what the HTTP layer, the tokenizer worker and
the message passing cost. For each burst, how busy every process was (CPU seconds per second):
a process near 1.0 is the one holding the others back; and the server's load as its ``/metrics``
showed it every 0.1 s (``load``: the most requests running and waiting at once, the KV pool's
size and highest use). The prefix cache is off on both sides,
so the server's second run of the same prompts computes them again. The result goes to
``benchmarks/results/http_<shape>_<device>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time

import torch

from benchmarks.cli import write_result
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, make_workload, run_yardstick
from minisgl.testing.processes import child_pids, cpu_seconds, process_name


async def _burst(url: str, prompts: list[list[int]], out_lens: list[int], stream: bool) -> dict:
    import httpx

    async def one(client: httpx.AsyncClient, prompt: list[int], n: int) -> tuple[int, int]:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}
        if not stream:
            r = await client.post(f"{url}/v1/completions", json=body)
            r.raise_for_status()
            return 1, r.json()["usage"]["completion_tokens"]
        body["stream_options"] = {"include_usage": True}
        chunks, usage = 0, 0
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"status {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                chunks += bool(event["choices"])
                if event.get("usage"):
                    usage = event["usage"]["completion_tokens"]
        return chunks, usage

    limits = httpx.Limits(max_connections=len(prompts) + 8)
    load: dict = {}
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        await one(client, prompts[0][::-1], 8)  # warm-up
        done = asyncio.Event()
        poller = asyncio.create_task(_watch_load(client, url, load, done))
        start = time.perf_counter()
        try:
            results = await asyncio.gather(*(one(client, p, n) for p, n in zip(prompts, out_lens)))
        finally:  # a failed burst stops the watcher too
            elapsed = time.perf_counter() - start
            done.set()
        await poller
    chunks = sum(c for c, _ in results)
    produced = sum(u for _, u in results)
    if produced != sum(out_lens) or (stream and chunks != produced):
        raise RuntimeError(f"the server produced {produced} tokens in {chunks} chunks; {sum(out_lens)} were asked for")
    kind = "stream" if stream else "no stream"
    print(f"server ({kind}): {produced} tokens in {elapsed:.2f} s = {produced / elapsed:.1f} out tok/s")
    return {"requests": len(prompts), "output_tokens": produced, "sse_chunks": chunks if stream else 0,
            "time_s": elapsed, "output_tok_s": produced / elapsed, "load": load}


async def _watch_load(client, url: str, load: dict, done: asyncio.Event, period_s: float = 0.1) -> None:
    """Read the server's ``/metrics`` every ``period_s`` during a burst, into ``load``: the most
    requests running and waiting at once, the KV pool's pages and the highest share of them held
    by requests, and how many samples were read. A server whose running batch stays small (a
    smaller KV pool, requests held back) is told apart from one whose tokenizer process is slow."""
    from minisgl.server.metrics import parse_metrics

    load.update(samples=0, running_max=0.0, waiting_max=0.0, kv_pages_total=0.0, kv_usage_max=0.0)
    while not done.is_set():
        page = parse_metrics((await client.get(f"{url}/metrics")).text)
        load["samples"] += 1
        load["running_max"] = max(load["running_max"], page.get("minisgl_num_running_requests", 0.0))
        load["waiting_max"] = max(load["waiting_max"], page.get("minisgl_num_waiting_requests", 0.0))
        load["kv_pages_total"] = page.get("minisgl_kv_pages_total", load["kv_pages_total"])
        load["kv_usage_max"] = max(load["kv_usage_max"], page.get("minisgl_kv_usage", 0.0))
        try:
            await asyncio.wait_for(done.wait(), period_s)
        except TimeoutError:
            pass


def _processes(server) -> list[int]:
    """The server, its children, their children (tensor-parallel ranks), and this client."""
    pids = [server.proc.pid, *server.children]
    pids += [g for c in server.children for g in child_pids(c)]
    return pids + [os.getpid()]


def _measured_burst(server, prompts, out_lens, stream: bool) -> dict:
    """A burst, and how busy each process was during it (CPU seconds / wall seconds)."""
    pids = _processes(server)
    before = {pid: cpu_seconds(pid) for pid in pids}
    result = asyncio.run(_burst(server.url, prompts, out_lens, stream))
    busy = {}
    for pid in pids:
        label = "client" if pid == os.getpid() else process_name(pid)
        busy[label] = round((cpu_seconds(pid) - before[pid]) / result["time_s"], 3)
    print("  CPU busy (fraction of one core): " + ", ".join(f"{k} {v:.2f}" for k, v in busy.items()))
    result["cpu_busy"] = busy
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks http", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num-requests", type=int, default=128)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-threads", type=int, default=2)
    p.add_argument("--warmup-burst", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the whole burst once, untimed, on each side before timing it")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from minisgl import LLM
    from minisgl.testing.server import ServerProcess

    model_dir, dummy, name = benchmark_checkpoint(args.shape)
    vocab = SHAPES[args.shape]["vocab_size"] if args.shape in SHAPES else 512
    prompts, out_lens = make_workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
    dtype = benchmark_dtype(args.device, args.cpu_threads)

    # No prefix cache on either side: the server runs the same prompts twice (with and without
    # streaming), and the second run must not find them cached.
    llm = LLM(model_dir, device=args.device, dtype=dtype, dummy_weights=dummy, prefix_cache=False)
    warmups = {}
    if args.warmup_burst:
        print("untimed: ", end="")
        warmups["offline_warmup"] = run_yardstick(llm, prompts, out_lens, args.device)
    offline = run_yardstick(llm, prompts, out_lens, args.device)
    llm.close()
    del llm
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()

    server_args = ["--no-prefix-cache"] + (["--dummy-weights"] if dummy else [])
    with ServerProcess(model_dir, *server_args, device=args.device, start_timeout=900, stop_timeout=15) as server:
        if args.warmup_burst:
            print("untimed: ", end="")
            warmups["server_warmup"] = asyncio.run(_burst(server.url, prompts, out_lens, stream=False))
        plain = _measured_burst(server, prompts, out_lens, stream=False)
        streamed = _measured_burst(server, prompts, out_lens, stream=True)
    ratios = {"no_stream": plain["output_tok_s"] / offline["output_tok_s"],
              "stream": streamed["output_tok_s"] / offline["output_tok_s"]}
    print("server / offline: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    out = args.out or f"benchmarks/results/http_{name}_{'gpu' if args.device.startswith('cuda') else 'cpu'}.json"
    config = {"shape": name, "device": args.device, "dtype": str(dtype), "num_requests": args.num_requests,
              "len_range": [args.min_len, args.max_len], "seed": args.seed, "warmup_burst": args.warmup_burst}
    path = write_result(out, "http", config, {"offline": offline, "server_no_stream": plain, "server_stream": streamed,
                                              "server_over_offline": ratios, **warmups})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
