"""``radix`` results: the prefix cache on and off, same shared-prefix requests, same run.

:func:`draw_radix` draws the chart (a matplotlib figure), :func:`radix_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

import posixpath
from typing import Any

from .common import (
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _faster,
    _file_link,
    _fmt,
    _is_number,
    _md_cell,
    _model_and_hardware,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
    _setup_parts,
)

RADIX_RUNS = (("cache_off", "cache off"), ("cache_on", "cache on"))  # (results key, label)
RADIX_SPEEDUP_ROW = "speed-up, cache on over off"


def _radix_runs(data: dict) -> dict[str, dict] | None:
    """``{"cache_off": run, "cache_on": run}``, each with a numeric ``output_tok_s``, or None."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    runs = {key: results.get(key) for key, _ in RADIX_RUNS}
    if not all(isinstance(run, dict) and _is_number(run.get("output_tok_s")) for run in runs.values()):
        return None
    return runs


def _radix_speedup(results: dict) -> float | None:
    """Output tok/s with the cache over without it: the file's ratio, else computed from the runs."""
    if _is_number(results.get("speedup")):
        return float(results["speedup"])
    try:
        return results["cache_on"]["output_tok_s"] / results["cache_off"]["output_tok_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _radix_hit_rate(run: dict) -> float | None:
    """Share of the prompt tokens served from the cache: ``hit_rate``, else computed from the counts."""
    if _is_number(run.get("hit_rate")):
        return float(run["hit_rate"])
    try:
        return run["cached_prompt_tokens"] / run["prompt_tokens"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _radix_answers(data: dict) -> str:
    config = _config(data)
    return f"{config['output_len']:,}-token answers" if _is_number(config.get("output_len")) else ""


def draw_radix(data: dict, theme: dict[str, Any]):
    """Output tok/s with the cache off and on (the speed-up beside the cache-on bar) and, beside
    them, the share of the prompt tokens each run served from the cache."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter, StrMethodFormatter

    runs = _radix_runs(data)
    if runs is None:
        return None
    speedup = _radix_speedup(data["results"])
    rates = [_radix_hit_rate(runs[key]) for key, _ in RADIX_RUNS]
    show_rates = all(r is not None for r in rates)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 2.5), layout="constrained")
    if show_rates:
        ax, ax2 = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    else:
        ax, ax2 = fig.subplots(), None
    y = list(range(len(RADIX_RUNS)))
    colors = [theme["other"], theme["accent"]]
    values = [float(runs[key]["output_tok_s"]) for key, _ in RADIX_RUNS]
    ax.barh(y, values, height=0.62, color=colors)
    ax.set_yticks(y, [label for _, label in RADIX_RUNS])
    ax.invert_yaxis()
    ax.set_xlim(0, max(values) * 1.6 or 1.0)  # room for the speed-up beside the longer bar
    ax.set_xlabel("output tokens per second (higher is better)")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    for yi, (key, _), value in zip(y, RADIX_RUNS, values):
        text = _number(value, "tok/s")
        if key == "cache_on" and speedup is not None:
            text += f"   →  {_faster(speedup)}"
        ax.annotate(text, (value, yi), xytext=(6, 0), textcoords="offset points", va="center", fontweight="bold")
    axes = [ax]
    if ax2 is not None:
        ax2.barh(y, [100 * r for r in rates], height=0.62, color=colors)
        ax2.set_xlim(0, 100)
        ax2.xaxis.set_major_formatter(PercentFormatter(decimals=0))
        ax2.set_xlabel("prompt tokens served from the cache")
        for yi, rate in zip(y, rates):
            ax2.annotate(f"{rate:.1%}", (100 * rate, yi), xytext=(6, 0), textcoords="offset points", va="center")
        axes.append(ax2)
    for a in axes:
        a.set_axisbelow(True)
        a.tick_params(axis="y", length=0)
        a.grid(axis="y", visible=False)
        a.spines["left"].set_visible(False)
    answers = _radix_answers(data)
    fig.suptitle(f"Radix cache off and on{_on_hardware(data)}" + (f": {answers}" if answers else ""), x=0.01, ha="left")
    return fig


def radix_section(res: BenchmarkResult) -> list[str] | None:
    """The workload in one line, the plot, and the key numbers of both runs with the speed-up."""
    if _radix_runs(res.data) is None:
        return None
    out = _radix_headline(res.data)
    out += _plot_markdown(res, "Output tokens per second and prompt-token hit rate with the radix cache off and on")
    return out + _radix_table(res.results)


def _radix_table(results: dict) -> list[str]:
    """One column per run (cache off, cache on), one row per number, then the speed-up row and
    any other values of ``results``."""
    keys = [key for key, _ in RADIX_RUNS]
    metrics = list(dict.fromkeys(m for key in keys for m in results[key] if m != "prefix_cache"))
    out = ["| | " + " | ".join(label for _, label in RADIX_RUNS) + " |", "|---|" + "---:|" * len(keys)]
    for m in metrics:
        cells = [_fmt(results[key][m]) if m in results[key] else "—" for key in keys]
        out.append(f"| {_md_cell(m)} | " + " | ".join(cells) + " |")
    speedup = _radix_speedup(results)
    if speedup is not None:
        out.append(f"| {RADIX_SPEEDUP_ROW} | — | **{_number(speedup)}×** |")
    rest = {k: v for k, v in results.items() if k not in (*keys, "speedup")}
    return out + ([""] + _results_block(rest) if rest else [])


def _radix_headline(data: dict) -> list[str]:
    config = _config(data)
    parts = _setup_parts(config)
    groups, per_group = config.get("groups"), config.get("per_group")
    if _is_number(groups) and _is_number(per_group):
        parts.append(f"{groups * per_group:,} requests = {groups} groups × {per_group}")
    if _is_number(config.get("system_len")):
        prompt = f"{config['system_len']:,}-token system prompt shared by a group"
        if _is_number(config.get("question_len")):
            prompt += f" + {config['question_len']:,}-token question"
        parts.append(prompt)
    if _radix_answers(data):
        parts.append(_radix_answers(data))
    if _is_number(config.get("page_size")):
        parts.append(f"page size {config['page_size']}")
    if config.get("dummy_weights"):
        parts.append("random weights")
    return [" · ".join(parts), ""] if parts else []


def _radix_workload(data: dict) -> str:
    """``256 requests (16 × 16), prompts 2,048 shared + 128, 256-token answers``, from the config."""
    config = _config(data)
    parts = []
    groups, per_group = config.get("groups"), config.get("per_group")
    if _is_number(groups) and _is_number(per_group):
        parts.append(f"{groups * per_group:,} requests ({groups} × {per_group})")
    if _is_number(config.get("system_len")) and _is_number(config.get("question_len")):
        parts.append(f"prompts {config['system_len']:,} shared + {config['question_len']:,}")
    if _radix_answers(data):
        parts.append(_radix_answers(data))
    return ", ".join(parts) or "—"


def radix_comparison(results: list[BenchmarkResult]) -> str:
    """The Benchmarks page's side-by-side table of every radix result (one row per file)."""
    rows = []
    for res in results:
        runs = _radix_runs(res.data) if res.name == "radix" else None
        if runs is None:
            continue
        off, on = runs["cache_off"], runs["cache_on"]
        rate = _radix_hit_rate(on)
        speedup = _radix_speedup(res.results)
        cells = [
            _model_and_hardware(res.data),
            _md_cell(_radix_workload(res.data)),
            f"{rate:.1%}" if rate is not None else "—",
            _number(off["output_tok_s"]),
            _number(on["output_tok_s"]),
            f"**{_number(speedup)}×**" if speedup is not None else "—",
            _file_link(res.rel, posixpath.basename(res.rel)),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return "_No radix results committed yet._\n"
    head = [
        "| model, hardware | workload | prompt tokens from the cache | output tok/s, cache off"
        " | output tok/s, cache on | speed-up | file |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + rows) + "\n"
