"""``offline`` results: output tokens per second, minisgl engine against Hugging Face generate.

:func:`draw_offline` draws the chart (a matplotlib figure), :func:`offline_section` writes the
Benchmarks page section (Markdown): the workload (said to be smaller than the yardstick's when it
is), the chart, the numbers and, for a shape a lesson sets a target on (:data:`OFFLINE_TARGETS`),
that target judged from the file."""

from __future__ import annotations

import textwrap
from typing import Any

from .common import (
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _faster,
    _fmt,
    _is_number,
    _md_cell,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
    _setup_parts,
)

# (results key, label, key of minisgl's speed-up over that run): the engine, then the baselines.
# ``hf_batched`` (static batches) is newer than ``hf`` (one request at a time): a file may lack it.
OFFLINE_RUNS = (
    ("engine", "minisgl engine", None),
    ("hf_batched", "HF generate", "speedup_vs_hf_batched"),
    ("hf", "HF generate", "speedup_vs_hf"),
)


# The offline yardstick's workload (``python -m benchmarks offline``'s defaults, and the Benchmarks
# page's definition): requests, shortest and longest input and output lengths.
YARDSTICK = (256, 100, 1024)

# model shape -> (the lesson, the least speed-up of minisgl over HF generate in static batches on
# the same workload): a lesson's target on that shape.
OFFLINE_TARGETS = {
    "qwen3-30b-a3b": ("[lesson 11](../lessons/l11/README.md)", 10.0),
}


def _offline_runs(results: dict) -> list[tuple[str, str, str | None]]:
    """The runs of :data:`OFFLINE_RUNS` that ``results`` has, each with its output tok/s."""
    return [
        (key, label, speedup_key)
        for key, label, speedup_key in OFFLINE_RUNS
        if isinstance(results.get(key), dict) and isinstance(results[key].get("output_tok_s"), (int, float))
    ]


def _offline_bars(data: dict) -> list[tuple[str, float, bool, float | None]] | None:
    """``(label, output tok/s, is minisgl, minisgl's speed-up over it)`` per run, or None."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    bars = []
    for key, label, speedup_key in _offline_runs(results):
        run = results[key]
        detail = ", ".join(([str(run["mode"])] if run.get("mode") else [])
                           + ([f"{run['requests']} requests"] if isinstance(run.get("requests"), int) else []))
        # A long mode ("static batches of 64, left-padded, ...") on lines of its own, so that the
        # labels do not squeeze the bars.
        lines = [label] + textwrap.wrap(detail, 34)
        speedup = _offline_speedup(results, key, speedup_key) if speedup_key else None
        bars.append(("\n".join(lines), float(run["output_tok_s"]), key == "engine", speedup))
    return bars if any(is_engine for _, _, is_engine, _ in bars) else None


def _offline_speedup(results: dict, key: str, speedup_key: str) -> float | None:
    """minisgl's output tok/s over run ``key``'s: the file's ratio, else computed from the runs."""
    value = results.get(speedup_key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return results["engine"]["output_tok_s"] / results[key]["output_tok_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _speedup_text(speedup: float) -> str:
    return f"minisgl is {_faster(speedup)}"


def draw_offline(data: dict, theme: dict[str, Any]):
    """Horizontal bars of output tok/s, each labelled with its value; minisgl's speed-up beside
    each Hugging Face baseline's (one request at a time, and static batches when measured)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    bars = _offline_bars(data)
    if bars is None:
        return None
    values = [value for _, value, _, _ in bars]
    label_lines = max(label.count("\n") + 1 for label, _, _, _ in bars)
    fig = Figure(figsize=(PLOT_WIDTH_IN, max(0.65, 0.2 * label_lines + 0.2) * len(bars) + 1.1), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(bars)))
    ax.barh(y, values, height=0.62, color=[theme["accent"] if eng else theme["other"] for _, _, eng, _ in bars])
    ax.set_yticks(y, [label for label, _, _, _ in bars])
    ax.invert_yaxis()
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.spines["left"].set_visible(False)
    ax.set_xlim(0, max(values) * 1.18 or 1.0)
    ax.set_xlabel("output tokens per second (higher is better)")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    model = _config(data).get("model")
    ax.set_title(f"Output throughput{f' ({model})' if model else ''}{_on_hardware(data)}", loc="left")
    for yi, (_, value, is_engine, speedup) in zip(y, bars):
        text = _number(value, "tok/s")
        if not is_engine and speedup is not None:
            text += f"   →  {_speedup_text(speedup)}"
        ax.annotate(text, (value, yi), xytext=(6, 0), textcoords="offset points", va="center", fontweight="bold")
    return fig


def offline_section(res: BenchmarkResult) -> list[str] | None:
    """Headline of the workload, the bar chart and the key numbers (speed-ups included)."""
    if _offline_bars(res.data) is None:
        return None
    out = _offline_headline(res.data)
    out += _smaller_workload(res.data) + _offline_target(res.data)
    out += _plot_markdown(res, "Output tokens per second: minisgl engine against Hugging Face generate")
    return out + _offline_table(res.results)


def _offline_target(data: dict) -> list[str]:
    """The lesson's target on this shape, reached or not as the file's static-batch ratio says."""
    target = OFFLINE_TARGETS.get(str(_config(data).get("model")))
    if target is None:
        return []
    lesson, least = target
    what = f"the yardstick at {_number(least)}× HF generate in static batches or more, on the same workload"
    results = data["results"]
    speedup = _offline_speedup(results, "hf_batched", "speedup_vs_hf_batched") \
        if isinstance(results.get("hf_batched"), dict) else None
    if speedup is None:
        return [f"Target of {lesson}: {what}: not judged (no static-batch baseline in this run).", ""]
    return [f"Target of {lesson}: {what}: **{_number(speedup)}×, {'reached' if speedup >= least else 'not reached'}**.", ""]


def _smaller_workload(data: dict) -> list[str]:
    """A line saying so when the run served fewer or shorter requests than the yardstick's."""
    config = _config(data)
    n, lens = config.get("num_requests"), config.get("len_range")
    if not (_is_number(n) and isinstance(lens, list) and len(lens) == 2 and all(_is_number(v) for v in lens)):
        return []
    requests, lo, hi = YARDSTICK
    if n >= requests and lens[0] >= lo and lens[1] >= hi:
        return []
    return [f"A smaller workload than the yardstick's ({requests} requests, input and output lengths {lo:,}–{hi:,} "
            f"tokens): {n:,} requests of {lens[0]:,}–{lens[1]:,} tokens, so at most {n:,} are in flight and the "
            "contexts stay short; its throughput is not comparable with a full yardstick run's.", ""]


def _offline_table(results: dict) -> list[str]:
    """The key numbers: one column per run (engine, then the HF baselines), a row of speed-ups,
    then any other values of ``results``."""
    runs = [(key, label) for key, label, _ in OFFLINE_RUNS if isinstance(results.get(key), dict)]
    heads = [label + (f" ({_md_cell(str(results[key]['mode']))})" if results[key].get("mode") else "") for key, label in runs]
    metrics = list(dict.fromkeys(m for key, _ in runs for m in results[key] if m != "mode"))
    out = ["| | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(runs)]
    for m in metrics:
        cells = [_fmt(results[key][m]) if m in results[key] else "—" for key, _ in runs]
        out.append(f"| {_md_cell(m)} | " + " | ".join(cells) + " |")
    speedup_keys = {key: sk for key, _, sk in OFFLINE_RUNS if sk}
    cells = []
    for key, _ in runs:
        speedup = _offline_speedup(results, key, speedup_keys[key]) if key in speedup_keys else None
        cells.append(f"**{_number(speedup)}×**" if speedup is not None else "—")
    if any(c != "—" for c in cells):
        out.append("| minisgl speed-up | " + " | ".join(cells) + " |")
    shown = {key for key, _ in runs} | {speedup_keys[key] for key, _ in runs if key in speedup_keys}
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _offline_headline(data: dict) -> list[str]:
    config = _config(data)
    parts = _setup_parts(config)
    if config.get("num_requests"):
        parts.append(f"{_fmt(config['num_requests'])} requests")
    lens = config.get("len_range")
    if isinstance(lens, list) and len(lens) == 2:
        parts.append(f"input and output lengths {_fmt(lens[0])}–{_fmt(lens[1])} tokens")
    if config.get("dummy_weights"):
        parts.append("random weights")
    return [" · ".join(parts), ""] if parts else []
