"""Where the offline yardstick's time goes, step by step, against what the hardware allows.

Runs the yardstick workload of ``python -m benchmarks offline`` once (every feature on) and
records every step the engine launches: its kind (prefill, mixed, decode and its row count),
the device's busy time for it and the idle gap before it (CUDA events recorded around each
launch; on the CPU the host time of the launch), and the step's **lower bound**: the larger of

* bytes / bandwidth: the weights read once (the embedding table only as the LM head, if tied),
  every row's KV read once (its whole context, new tokens included) and the new KV written;
* FLOPs / peak: 2 per weight per token (the LM head's: per sampling row), plus attention's q·k
  and p·v over each new token's context,

with the bandwidth of a device-to-device copy and the bf16 peak of a large matmul, both
measured in the same run. On CUDA, windows of steps are profiled (by default three mixed steps
after the first and ten decode steps at the full batch) and their kernels grouped by kind, as
``bench graphs`` does for bs=1. Profiled steps are left out of the table.

    python -m benchmarks steps                                   # GPU, Qwen3-0.6B shape
    python -m benchmarks steps --device cpu --shape tiny --num-requests 16 --min-len 8 --max-len 32
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch

from benchmarks.cli import benchmark_parser, write_result
from benchmarks.graphs import kernels_by_kind
from benchmarks.offline import SHAPES, benchmark_checkpoint, benchmark_dtype, make_workload, sync
from minisgl.core import Batch
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams

# Decode steps are grouped by their row count; the last group is the yardstick's full batch.
DECODE_GROUPS = ((1, 16), (17, 64), (65, 128), (129, 192), (193, 256), (257, 1 << 30))


@dataclass
class Step:
    """One launched batch. Times in ms; ``bound_ms`` is the hardware's lower bound for it."""

    mode: str
    rows: int
    tokens: int  # new tokens (prompt tokens and decode tokens)
    sampled: int  # rows that sample a token
    context: int  # KV tokens the rows attend over, new ones included
    busy_ms: float = 0.0
    idle_ms: float = 0.0  # the device's gap before this step (host-bound)
    bound_ms: float = 0.0
    profiled: bool = False

    @property
    def group(self) -> str:
        if self.mode != "decode":
            return self.mode
        return decode_group_name(*next(g for g in DECODE_GROUPS if g[0] <= self.rows <= g[1]))


def decode_group_name(lo: int, hi: int) -> str:
    return f"decode {lo}-{hi} rows" if hi < 1 << 30 else f"decode >{lo - 1} rows"


@dataclass
class Hardware:
    """What the device does at best, measured here: bytes/s of a copy (reads + writes) and
    FLOP/s of a large matmul in the model's dtype."""

    bandwidth: float
    flops: float

    @classmethod
    def measure(cls, device: str, dtype: torch.dtype) -> Hardware:
        cuda = device.startswith("cuda")
        nbytes, n = (2 << 30, 8192) if cuda else (16 << 20, 512)  # (a CPU run only checks the plumbing)
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        copy_s = best_seconds(device, lambda: dst.copy_(src))
        matmul_s = best_seconds(device, lambda: a @ b)
        return cls(bandwidth=2 * nbytes / copy_s, flops=2 * n**3 / matmul_s)


def best_seconds(device: str, fn, repeats: int = 10) -> float:
    """The fastest of ``repeats`` timed calls (after two warm-ups)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass
class ModelCost:
    """Bytes and FLOPs of the model that do not depend on the batch."""

    weight_bytes: int  # read once per step
    body_params: int  # matrix weights every new token is multiplied by (2 FLOPs each)
    lm_head_params: int  # the LM head's, for the sampling rows only
    kv_bytes_per_token: int
    attention_flops_per_pair: int  # per (query token, context token): q·k and p·v, every layer

    @classmethod
    def of(cls, llm: LLM) -> ModelCost:
        weight_bytes = body = head = 0
        embed = None
        for name, p in llm.model.named_parameters():
            if "embed_tokens" in name:
                embed = p  # only the looked-up rows are read; as a tied LM head it is read whole
                continue
            weight_bytes += p.numel() * p.element_size()
            if name.startswith("lm_head"):
                head += p.numel()
            elif p.dim() == 2:
                body += p.numel()
        if llm.config.tie_word_embeddings and embed is not None:
            weight_bytes += embed.numel() * embed.element_size()
            head += embed.numel()
        pool, cfg = llm.pool, llm.config
        layers = len(pool.k)
        kv = layers * 2 * pool.num_kv_heads * pool.head_dim * pool.k[0].element_size()
        return cls(weight_bytes, body, head, kv, layers * 4 * cfg.num_heads * cfg.head_dim)

    def bound_ms(self, step: Step, new_per_row: list[int], context_per_row: list[int], hw: Hardware) -> float:
        """The step's lower bound (see the module docstring)."""
        pairs = sum(n * (c - n) + n * (n + 1) // 2 for n, c in zip(new_per_row, context_per_row))
        flops = 2 * (self.body_params * step.tokens + self.lm_head_params * step.sampled) \
            + self.attention_flops_per_pair * pairs
        moved = self.weight_bytes + self.kv_bytes_per_token * (step.context + step.tokens)
        return 1e3 * max(moved / hw.bandwidth, flops / hw.flops)


@dataclass
class Window:
    """A stretch of steps to profile: ``count`` steps from the one after ``skip`` steps of
    ``mode`` (decode: at the largest batch seen, or, with ``max_rows``, of at most that many
    rows: the batch shrinking as requests finish). ``kernels`` is filled once it has run."""

    mode: str
    skip: int
    count: int
    max_rows: int | None = None
    seen: int = 0
    profiled: list[int] = field(default_factory=list)  # indices of the profiled steps
    kernels: dict | None = None

    @classmethod
    def parse(cls, text: str) -> Window:
        """``MODE:SKIP:COUNT``, e.g. ``decode:50:10``; ``decode<=ROWS:SKIP:COUNT`` counts only
        decode steps of at most ``ROWS`` rows, e.g. ``decode<=128:0:10``."""
        mode, skip, count = text.split(":")
        mode, _, rows = mode.partition("<=")
        if mode not in ("prefill", "mixed", "decode"):
            raise argparse.ArgumentTypeError(f"a window's mode is prefill, mixed or decode, got {mode!r}")
        if rows and mode != "decode":
            raise argparse.ArgumentTypeError(f"only decode windows take a row limit, got {text!r}")
        return cls(mode, int(skip), int(count), int(rows) if rows else None)

    def counts(self, step: Step, max_rows_seen: int) -> bool:
        """Whether ``step`` is one of the steps this window counts toward its start."""
        if self.mode != step.mode:
            return False
        if step.mode != "decode":
            return True
        return step.rows <= self.max_rows if self.max_rows is not None else step.rows == max_rows_seen


class StepRecorder:
    """Wraps the engine's ``launch`` (overlap) or ``step`` to time every batch it runs.

    On CUDA two timing events go around each launch, on the launching stream: the first runs
    once the device has finished everything before it, or when the host gets there, whichever
    is later, so ``start_i - end_{i-1}`` is the device's idle gap and ``end_i - start_i`` its
    busy time for batch i. On the CPU the launch itself is timed."""

    def __init__(self, llm: LLM, cost: ModelCost, hw: Hardware, windows: list[Window]) -> None:
        self.engine = llm.engine
        self.cuda = self.engine.device.type == "cuda"
        self.cost, self.hw = cost, hw
        self.steps: list[Step] = []
        self.events: list[tuple] = []
        self.name = "launch" if hasattr(self.engine, "launch") else "step"
        self.real = getattr(self.engine, self.name)
        self.windows = windows
        self.active: Window | None = None  # the window being profiled
        self.profiler = None
        self.max_rows = 0

    def __enter__(self) -> StepRecorder:
        setattr(self.engine, self.name, self.run)
        return self

    def __exit__(self, *exc) -> None:
        delattr(self.engine, self.name)  # back to the class's method
        if self.profiler is not None:
            self.stop_profiler()

    def run(self, batch: Batch):
        new = list(batch.extend_lens)
        context = list(batch.cached_after)
        step = Step(batch.mode, batch.size, sum(new), len(batch.sampling_reqs), sum(context) - sum(new))
        step.bound_ms = self.cost.bound_ms(step, new, context, self.hw)
        self.maybe_profile(step)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.real(batch)
            end.record()
            self.events.append((start, end))
        else:
            t0 = time.perf_counter()
            out = self.real(batch)
            step.busy_ms = 1e3 * (time.perf_counter() - t0)
        self.steps.append(step)
        return out

    def maybe_profile(self, step: Step) -> None:
        """Start or stop the profiler around the windows (CUDA only): each window profiles
        ``count`` consecutive steps once ``skip`` steps of its kind have gone by (for decode:
        steps with the most rows seen so far)."""
        if not self.cuda:
            return
        if self.active is not None:
            if len(self.active.profiled) == self.active.count:
                self.stop_profiler()
                step.profiled = True  # it waited for the profiler's synchronisation: left out too
            else:
                step.profiled = True
                self.active.profiled.append(len(self.steps))
                return
        if step.mode == "decode":
            self.max_rows = max(self.max_rows, step.rows)
        for window in self.windows:
            if window.kernels is not None or not window.counts(step, self.max_rows):
                continue
            window.seen += 1
            if window.seen > window.skip:
                from torch.profiler import ProfilerActivity, profile

                torch.cuda.synchronize()
                self.profiler = profile(activities=[ProfilerActivity.CUDA])
                self.profiler.start()
                self.active = window
                step.profiled = True
                window.profiled.append(len(self.steps))
                return

    def stop_profiler(self) -> None:
        torch.cuda.synchronize()
        self.profiler.stop()
        window = self.active
        window.kernels = kernels_by_kind(self.profiler, len(window.profiled), top_names=4)
        window.kernels["us_per_step"] = sum(k["us_per_step"] for k in window.kernels["by_kind"].values())
        self.profiler, self.active = None, None

    def finish(self) -> list[Step]:
        """Read the events (after the run has been synchronised)."""
        if self.cuda:
            previous = None
            for step, (start, end) in zip(self.steps, self.events):
                step.busy_ms = start.elapsed_time(end)
                step.idle_ms = previous.elapsed_time(start) if previous is not None else 0.0
                previous = end
        return self.steps


def summarise(steps: list[Step]) -> dict:
    """Per group of steps (prefill, mixed, decode by rows): how many, their tokens, busy, idle
    and bound ms, and busy/bound (1.0: at the hardware's limit). Profiled steps are left out."""
    groups: dict[str, dict] = {}
    order = ["prefill", "mixed"] + [decode_group_name(lo, hi) for lo, hi in DECODE_GROUPS]
    for step in steps:
        if step.profiled:
            continue
        g = groups.setdefault(step.group, defaultdict(float))
        g["steps"] += 1
        g["tokens"] += step.tokens
        g["sampled"] += step.sampled
        g["busy_ms"] += step.busy_ms
        g["idle_ms"] += step.idle_ms
        g["bound_ms"] += step.bound_ms
    out = {}
    for name in [n for n in order if n in groups]:
        g = dict(groups[name])
        g["steps"], g["tokens"], g["sampled"] = int(g["steps"]), int(g["tokens"]), int(g["sampled"])
        g["busy_over_bound"] = g["busy_ms"] / g["bound_ms"] if g["bound_ms"] else None
        out[name] = g
    total = {k: sum(g[k] for g in out.values()) for k in ("steps", "tokens", "sampled", "busy_ms", "idle_ms", "bound_ms")}
    total["busy_over_bound"] = total["busy_ms"] / total["bound_ms"] if total["bound_ms"] else None
    out["all steps"] = total
    return out


def print_table(summary: dict) -> None:
    print(f"{'steps of kind':22s} {'steps':>6s} {'tokens':>8s} {'busy ms':>9s} {'idle ms':>8s} "
          f"{'bound ms':>9s} {'busy/bound':>10s}")
    for name, g in summary.items():
        ratio = f"{g['busy_over_bound']:.2f}x" if g["busy_over_bound"] else "-"
        print(f"{name:22s} {g['steps']:6d} {g['tokens']:8d} {g['busy_ms']:9.1f} {g['idle_ms']:8.1f} "
              f"{g['bound_ms']:9.1f} {ratio:>10s}")


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("steps", __doc__, out="benchmarks/results/steps_<shape>_<device>.json")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[*SHAPES, "tiny"])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--profile", type=Window.parse, nargs="*", default=None,
                        help="windows to profile on CUDA, MODE:SKIP:COUNT, or decode<=ROWS:SKIP:COUNT for "
                        "decode steps of at most ROWS rows (default: mixed:1:3 decode:50:10)")
    args = parser.parse_args(argv)

    device = args.device
    dtype = benchmark_dtype(device, args.threads)
    model_dir, dummy, name = benchmark_checkpoint(args.shape)
    hw = Hardware.measure(device, dtype)
    llm = LLM(model_dir, device=device, dtype=dtype, dummy_weights=dummy)
    prompts, out_lens = make_workload(args.num_requests, args.min_len, args.max_len, llm.config.vocab_size, args.seed)
    warm = [p[::-1] for p in prompts[:2]]
    llm.generate(warm, [SamplingParams(max_tokens=8, ignore_eos=True)] * len(warm), progress=False)
    cost = ModelCost.of(llm)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in out_lens]
    windows = [Window("mixed", 1, 3), Window("decode", 50, 10)] if args.profile is None else args.profile
    with StepRecorder(llm, cost, hw, windows) as recorder:
        sync(device)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, progress=False)
        sync(device)
        wall_s = time.perf_counter() - start
    steps = recorder.finish()
    produced = sum(len(o.token_ids) for o in outs)
    if produced != sum(out_lens):
        raise RuntimeError(f"produced {produced} tokens, asked for {sum(out_lens)}")
    summary = summarise(steps)
    print(f"{produced} tokens in {wall_s:.2f} s = {produced / wall_s:.0f} out tok/s; copy bandwidth "
          f"{hw.bandwidth / 1e12:.2f} TB/s, matmul {hw.flops / 1e12:.3g} TFLOP/s")
    print_table(summary)
    bound_s = summary["all steps"]["bound_ms"] / 1e3
    print(f"bound for the whole run: {bound_s:.2f} s = {produced / bound_s:.0f} out tok/s "
          f"(steps left out of the table, profiled: {sum(s.profiled for s in steps)})")
    for w in windows:
        if w.kernels:
            what = w.mode if w.max_rows is None else f"{w.mode} (<= {w.max_rows} rows)"
            print(f"\nprofiled: {w.count} {what} step(s) after {w.skip}: {w.kernels['kernels_per_step']:.0f} kernels, "
                  f"{w.kernels['us_per_step']:.0f} us per step")
            for kind, k in w.kernels["by_kind"].items():
                top, us = next(iter(k["top_kernels_us_per_step"].items()))
                print(f"  {kind[:44]:44s} {k['kernels_per_step']:6.1f} {k['us_per_step']:9.1f} us   top: {top[:60]} {us:.0f} us")
    results = {"output_tokens": produced, "wall_s": wall_s, "output_tok_s": produced / wall_s,
               "copy_bandwidth_tb_s": hw.bandwidth / 1e12, "matmul_tflop_s": hw.flops / 1e12,
               "model": asdict(cost), "groups": summary,
               "profiled_windows": [{"mode": w.mode, "skip": w.skip, "count": w.count, "max_rows": w.max_rows,
                                     **(w.kernels or {}),
                                     "profiled_steps": [asdict(steps[i]) for i in w.profiled]} for w in windows],
               "steps": [asdict(s) for s in steps]}
    config = {"model": name, "dummy_weights": dummy, "device": device, "dtype": str(dtype).replace("torch.", ""),
              "num_requests": args.num_requests, "len_range": [args.min_len, args.max_len], "seed": args.seed,
              "engine": "LLM defaults (every feature on)"}
    out = args.out or f"benchmarks/results/steps_{name}_{'gpu' if device.startswith('cuda') else 'cpu'}.json"
    print(f"wrote {write_result(out, 'steps', config, results)}")


if __name__ == "__main__":
    main()
