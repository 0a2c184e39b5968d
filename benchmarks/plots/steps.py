"""``steps`` results: the offline yardstick step by step, each kind of step's device time against
its lower bound (``python -m benchmarks steps``).

:func:`draw_steps` draws the chart (a matplotlib figure), :func:`steps_section` writes the
Benchmarks page section (Markdown). The per-step records (``results.steps``, one per launched
step) stay in the file: the page shows the groups and the profiled windows."""

from __future__ import annotations

from typing import Any

from .common import PLOT_WIDTH_IN, BenchmarkResult, _fmt, _md_cell, _number, _on_hardware, _plot_markdown
from .offline import _offline_headline


def _groups(data: dict) -> dict[str, dict] | None:
    """``results.groups`` without the total, or None when the file has no usable groups."""
    groups = (data.get("results") or {}).get("groups")
    if not isinstance(groups, dict):
        return None
    rows = {k: v for k, v in groups.items() if k != "all steps" and isinstance(v, dict)
            and all(isinstance(v.get(m), (int, float)) for m in ("busy_ms", "bound_ms"))}
    return rows or None


def draw_steps(data: dict, theme: dict[str, Any]):
    """Per kind of step, two horizontal bars: the device's busy time over the run and the lower
    bound, the busy bar labelled with busy / bound."""
    from matplotlib.figure import Figure

    groups = _groups(data)
    if groups is None:
        return None
    names = list(groups)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 0.55 * len(names) + 1.3), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(names)))
    busy = [groups[n]["busy_ms"] for n in names]
    bound = [groups[n]["bound_ms"] for n in names]
    ax.barh([v - 0.2 for v in y], busy, height=0.38, color=theme["accent"], label="device busy")
    ax.barh([v + 0.2 for v in y], bound, height=0.38, color=theme["other"], label="lower bound")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, max(busy + bound) * 1.2 or 1.0)
    ax.set_xlabel("ms over the whole run (lower is better)")
    ax.set_title(f"The offline yardstick by kind of step{_on_hardware(data)}", loc="left")
    for yi, b, lo in zip(y, busy, bound):
        if lo:
            ax.annotate(f"{_number(b / lo)}× the bound", (b, yi - 0.2), xytext=(6, 0), textcoords="offset points",
                        va="center", fontweight="bold")
    ax.legend(loc="lower right")
    return fig


def steps_section(res: BenchmarkResult) -> list[str] | None:
    """The workload, the chart, a row per kind of step, the run's numbers and each profiled
    window's kernels by kind."""
    groups = _groups(res.data)
    if groups is None:
        return None
    results = res.results
    out = _offline_headline(res.data)  # the same workload line as the offline yardstick's
    out += _plot_markdown(res, "Device time per kind of step against its lower bound")
    cols = ("steps", "tokens", "busy_ms", "idle_ms", "bound_ms", "busy_over_bound")
    out += ["| steps of kind | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    total = (results.get("groups") or {}).get("all steps")
    for name, row in [*groups.items(), *([("all steps", total)] if isinstance(total, dict) else [])]:
        out.append(f"| {_md_cell(name)} | " + " | ".join(_fmt(row.get(c, "—")) for c in cols) + " |")
    numbers = {k: results[k] for k in ("output_tokens", "wall_s", "output_tok_s", "copy_bandwidth_tb_s",
                                       "matmul_tflop_s") if k in results}
    if isinstance(total, dict) and total.get("bound_ms") and results.get("output_tokens"):
        numbers["bound_out_tok_s"] = results["output_tokens"] / total["bound_ms"] * 1e3
    if numbers:
        out += ["", "| metric | value |", "|---|---:|"]
        out += [f"| {_md_cell(k)} | {_fmt(v)} |" for k, v in numbers.items()]
    for window in results.get("profiled_windows") or []:
        kinds = window.get("by_kind") if isinstance(window, dict) else None
        if not kinds:
            continue
        out += ["", f"**Profiled: {_fmt(window.get('count'))} {_md_cell(str(window.get('mode')))} step(s)**, "
                f"{_fmt(window.get('kernels_per_step'))} kernels and {_fmt(window.get('us_per_step'))} µs per step", "",
                "| kernels of kind | per step | µs per step |", "|---|---:|---:|"]
        out += [f"| {_md_cell(kind)} | {_fmt(k.get('kernels_per_step'))} | {_fmt(k.get('us_per_step'))} |"
                for kind, k in kinds.items()]
    return out
