"""``chunked`` results: short requests behind one long prompt, whole prompts against each chunk
size.

:func:`draw_chunked` draws the chart (a matplotlib figure), :func:`chunked_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from .common import (
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _file_link,
    _indent,
    _is_number,
    _is_rows,
    _md_cell,
    _model_and_hardware,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
    _setup_parts,
    _short_count,
)

CHUNKED_BASELINE = "whole"  # the key of the setting without chunking (chunked_prefill_size None)


def _chunked_settings(data: dict) -> dict[str, dict] | None:
    """``results.settings`` with whole prompts first, keeping the settings whose short-request
    TTFT has a numeric p50 and p99; None unless whole prompts and one chunk size are there."""
    results = data.get("results")
    settings = results.get("settings") if isinstance(results, dict) else None
    if not isinstance(settings, dict):
        return None
    usable = {
        key: run for key, run in settings.items()
        if isinstance(run, dict) and isinstance(run.get("short_ttft_s"), dict)
        and all(_is_number(run["short_ttft_s"].get(q)) for q in ("p50", "p99"))
    }
    if CHUNKED_BASELINE not in usable or len(usable) < 2:
        return None
    return {CHUNKED_BASELINE: usable.pop(CHUNKED_BASELINE), **usable}


def _chunk_size(key: str, run: dict) -> int | None:
    """A setting's chunk size: ``chunked_prefill_size``, else the number in a ``chunk_<N>`` key."""
    if _is_number(run.get("chunked_prefill_size")):
        return int(run["chunked_prefill_size"])
    m = re.fullmatch(r"chunk_(\d+)", key)
    return int(m.group(1)) if m else None


def _chunk_label(key: str, run: dict, short: bool = False) -> str:
    """``whole`` for the baseline; ``8,192`` (or ``8K`` with ``short``) for a chunk size."""
    size = _chunk_size(key, run)
    if key == CHUNKED_BASELINE or size is None:
        return key
    return _short_count(size) if short else f"{size:,}"


def _chunked_p99_ratio(settings: dict[str, dict], key: str) -> float | None:
    """Whole prompts' short-request p99 TTFT over this setting's: the file's ratio, else computed."""
    if _is_number(settings[key].get("p99_ratio_vs_whole")):
        return float(settings[key]["p99_ratio_vs_whole"])
    try:
        return settings[CHUNKED_BASELINE]["short_ttft_s"]["p99"] / settings[key]["short_ttft_s"]["p99"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _chunked_yardstick(data: dict, key: str) -> tuple[float, float | None] | None:
    """``(output tok/s, ratio over whole prompts)`` of a setting's offline yardstick run (the
    file's ``vs_whole``, else computed), or None when the file has no such run."""
    results = data.get("results")
    yard = results.get("yardstick") if isinstance(results, dict) else None
    run = yard.get(key) if isinstance(yard, dict) else None
    if not isinstance(run, dict) or not _is_number(run.get("output_tok_s")):
        return None
    if _is_number(run.get("vs_whole")):
        return float(run["output_tok_s"]), float(run["vs_whole"])
    try:
        return float(run["output_tok_s"]), run["output_tok_s"] / yard[CHUNKED_BASELINE]["output_tok_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        return float(run["output_tok_s"]), None


def _lower_text(ratio: float) -> str:
    """``5.74× lower`` for a ratio of the baseline's TTFT over a setting's (``2× higher`` below 1)."""
    return f"{_number(1 / ratio)}× higher" if 0 < ratio < 1 else f"{_number(ratio)}× lower"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def draw_chunked(data: dict, theme: dict[str, Any]):
    """Grouped bars per setting: the short requests' TTFT p50 and p99 (the p99 labelled with its
    ratio to whole prompts) and the long request's TTFT; beside them, the offline yardstick's
    throughput of each setting over whole prompts'."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    settings = _chunked_settings(data)
    if settings is None:
        return None
    keys = list(settings)
    yard = [_chunked_yardstick(data, key) for key in keys]
    show_yard = all(y is not None and y[1] is not None for y in yard)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 3.6), layout="constrained")
    if show_yard:
        ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    else:
        ax, ax2 = fig.subplots(), None
    x = list(range(len(keys)))
    ticks = [_chunk_label(key, settings[key], short=True) for key in keys]
    series = [("short requests, p50", [settings[k]["short_ttft_s"]["p50"] for k in keys], theme["series"][0]),
              ("short requests, p99", [settings[k]["short_ttft_s"]["p99"] for k in keys], theme["series"][1])]
    if all(_is_number(settings[k].get("long_ttft_s")) for k in keys):
        series.insert(0, ("the long request", [settings[k]["long_ttft_s"] for k in keys], theme["other"]))
    width = 0.72 / len(series)  # gaps between the groups leave room for the p99 labels
    for i, (label, values, color) in enumerate(series):
        offsets = [xi + (i - (len(series) - 1) / 2) * width for xi in x]
        ax.bar(offsets, [1e3 * v for v in values], width=width * 0.92, color=color, label=label)
    p99_x = [xi + (len(series) - 1) / 2 * width for xi in x]  # the p99 bars are the last series
    for xi, key in zip(p99_x, keys):
        p99 = settings[key]["short_ttft_s"]["p99"]
        ratio = _chunked_p99_ratio(settings, key) if key != CHUNKED_BASELINE else None
        text = f"{1e3 * p99:.1f}" + (f"\n{_lower_text(ratio)}" if ratio is not None else "")
        ax.annotate(text, (xi, 1e3 * p99), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8.5, fontweight="bold" if ratio is not None else "normal")
    top = max(max(values) for _, values, _ in series)
    ax.set_ylim(0, 1e3 * top * 1.2 or 1.0)
    ax.set_xticks(x, ticks)
    ax.set_xlabel("chunk size (tokens), or whole prompts")
    ax.set_ylabel("time to first token (ms)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_title("TTFT (lower is better)", loc="left")
    fig.legend(handles=ax.containers, loc="outside lower center", ncols=len(series))
    axes = [ax]
    if ax2 is not None:
        ratios = [y[1] for y in yard]
        colors = [theme["other"] if key == CHUNKED_BASELINE else theme["accent"] for key in keys]
        ax2.bar(x, ratios, width=0.62, color=colors)
        ax2.set_ylim(0, max(ratios + [1.0]) * 1.15)
        ax2.set_xticks(x, ticks)
        ax2.set_xlabel("chunk size (tokens), or whole prompts")
        ax2.set_ylabel("output tok/s, ratio to whole prompts")
        ax2.set_title("Offline yardstick (higher is better)", loc="left")
        for xi, ratio in zip(x, ratios):
            ax2.annotate(f"{ratio:.3f}×", (xi, ratio), xytext=(0, 3), textcoords="offset points",
                         ha="center", va="bottom", fontsize=8.5)
        axes.append(ax2)
    for a in axes:
        a.set_axisbelow(True)
        a.tick_params(axis="x", length=0)
        a.grid(axis="x", visible=False)
    config = _config(data)
    what = ""
    if _is_number(config.get("long_len")):
        what = f": short requests behind a {config['long_len']:,}-token prompt"
    fig.suptitle(f"Chunked prefill{_on_hardware(data)}{what}", x=0.01, ha="left")
    return fig


def chunked_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the ratios in two lines, the plot, one table row per setting, and the
    offline yardstick's runs folded away."""
    if _chunked_settings(res.data) is None:
        return None
    out = _chunked_headline(res.data)
    out += _plot_markdown(res, "Time to first token of the short requests and of the long one, and offline throughput, "
                               "per chunk size")
    return out + _chunked_table(res.data)


def _chunked_table(data: dict) -> list[str]:
    """One row per setting (whole prompts first), then the yardstick runs in a fold-out and any
    other values of ``results``."""
    settings = _chunked_settings(data) or {}
    out = [
        ("| setting | chunk size | short TTFT p50 | short TTFT p90 | short TTFT p99 | long-request TTFT"
         " | p99 vs whole | yardstick tok/s (vs whole) |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, run in settings.items():
        short = run["short_ttft_s"]
        ratio = _chunked_p99_ratio(settings, key) if key != CHUNKED_BASELINE else None
        yard = _chunked_yardstick(data, key)
        yard_cell = "—"
        if yard is not None:
            yard_cell = _number(yard[0]) + (f" ({yard[1]:.3f}×)" if yard[1] is not None else "")
        size = _chunk_size(key, run)
        cells = [
            f"`{_md_cell(key)}`",
            f"{size:,}" if size is not None else "—",
            _ms(short["p50"]),
            _ms(short["p90"]) if _is_number(short.get("p90")) else "—",
            f"**{_ms(short['p99'])}**",
            _ms(run["long_ttft_s"]) if _is_number(run.get("long_ttft_s")) else "—",
            f"**{_lower_text(ratio)}**" if ratio is not None else "—",
            yard_cell,
        ]
        out.append("| " + " | ".join(cells) + " |")
    results = data["results"]
    if _is_rows(results.get("yardstick")):
        out += ["", '??? note "Offline yardstick runs"', ""] + _indent(_results_block(results["yardstick"])) + [""]
    # The per-request lists are summarised above; the whole-prompt prefill time is in the headline.
    whole = {"whole_prefill_s"} if _is_number(results.get("whole_prefill_s")) else set()
    shown = {"settings", "yardstick", "arrivals_s"} | whole
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _chunked_workload(data: dict) -> str:
    """``one 32,768-token prompt, then 64 × 128-token requests over its whole prefill (331.6 ms)``."""
    config = _config(data)
    results = data.get("results") if isinstance(data.get("results"), dict) else {}
    parts = []
    if _is_number(config.get("long_len")):
        parts.append(f"one {config['long_len']:,}-token prompt")
    if _is_number(config.get("num_short")) and _is_number(config.get("short_len")):
        short = f"{config['num_short']:,} × {config['short_len']:,}-token requests"
        if _is_number(results.get("whole_prefill_s")):
            short += f" over its whole prefill ({_ms(results['whole_prefill_s'])})"
        parts.append(short)
    return ", then ".join(parts)


def _chunked_headline(data: dict) -> list[str]:
    """The workload on one line; on the next, the ratios against whole prompts: the short
    requests' p99 TTFT per chunk size, and the offline yardstick's throughput."""
    config = _config(data)
    parts = _setup_parts(config)
    if _chunked_workload(data):
        parts.append(_chunked_workload(data))
    if _is_number(config.get("output_len")):
        parts.append(f"{config['output_len']:,}-token answers")
    if _is_number(config.get("repeats")):
        parts.append(f"{config['repeats']} measured repeats")
    if config.get("dummy_weights"):
        parts.append("random weights")
    out = [" · ".join(parts), ""] if parts else []
    settings = _chunked_settings(data)
    if settings is None:
        return out
    chunks = [key for key in settings if key != CHUNKED_BASELINE]
    p99 = []
    for key in chunks:
        ratio = _chunked_p99_ratio(settings, key)
        if ratio is not None:
            p99.append(f"**{_lower_text(ratio)}** at {_chunk_label(key, settings[key])}")
    yards = [(key, _chunked_yardstick(data, key)) for key in chunks]
    line = []
    if p99:
        line.append("short-request p99 TTFT " + ", ".join(p99))
    if yards and all(y is not None and y[1] is not None for _, y in yards):
        line.append("offline yardstick throughput " + ", ".join(
            f"**{y[1]:.3f}×** at {_chunk_label(key, settings[key])}" for key, y in yards))
    return out + (["Against whole prompts: " + "; ".join(line) + ".", ""] if line else [])


def chunked_comparison(results: list[BenchmarkResult]) -> str:
    """The Benchmarks page's side-by-side table of every chunked result: one row per chunk size,
    the file's model, hardware, workload and link on its first row."""
    rows = []
    for res in results:
        settings = _chunked_settings(res.data) if res.name == "chunked" else None
        if settings is None:
            continue
        whole_p99 = settings[CHUNKED_BASELINE]["short_ttft_s"]["p99"]
        first = [_model_and_hardware(res.data), _md_cell(_chunked_workload(res.data) or "—")]
        link = _file_link(res.rel, posixpath.basename(res.rel))
        for key, run in settings.items():
            if key == CHUNKED_BASELINE:
                continue
            ratio = _chunked_p99_ratio(settings, key)
            yard = _chunked_yardstick(res.data, key)
            cells = first + [
                _chunk_label(key, run),
                f"{whole_p99 * 1e3:,.1f} → {_ms(run['short_ttft_s']['p99'])}",
                f"**{_lower_text(ratio)}**" if ratio is not None else "—",
                f"{yard[1]:.3f}×" if yard is not None and yard[1] is not None else "—",
                link,
            ]
            rows.append("| " + " | ".join(cells) + " |")
            first, link = ["", ""], ""
    if not rows:
        return "_No chunked-prefill results committed yet._\n"
    head = [
        ("| model, hardware | workload | chunk size | short-request p99 TTFT, whole → chunked"
         " | p99 vs whole | yardstick tok/s vs whole | file |"),
        "|---|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + rows) + "\n"
