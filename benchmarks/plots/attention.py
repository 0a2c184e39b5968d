"""``attention_decode`` results: KV read bandwidth against context length, per backend and batch
size.

:func:`draw_attention` draws the chart (a matplotlib figure), :func:`attention_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

from typing import Any

from .common import (
    MARKERS,
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _fmt,
    _indent,
    _md_cell,
    _number,
    _on_hardware,
    _plot_markdown,
    _rows_table,
    _short_count,
)

_ATTENTION_KEYS = ("backend", "batch", "context", "bandwidth_tb_s")


def _attention_rows(data: dict) -> list[dict] | None:
    """The measured rows of an ``attention_decode`` result, or None if they are not there."""
    results = data.get("results")
    rows = results.get("rows") if isinstance(results, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    for r in rows:
        if not isinstance(r, dict) or any(k not in r for k in _ATTENTION_KEYS):
            return None
        if not all(isinstance(r[k], (int, float)) for k in ("batch", "context", "bandwidth_tb_s")):
            return None
    return rows


def _copy_bandwidth(data: dict) -> float | None:
    value = data["results"].get("copy_bandwidth_tb_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def draw_attention(data: dict, theme: dict[str, Any]):
    """Small multiples, one panel per backend: a line per batch size, the copy bandwidth on top."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    rows = _attention_rows(data)
    if rows is None:
        return None
    copy = _copy_bandwidth(data)
    backends = list(dict.fromkeys(str(r["backend"]) for r in rows))
    batches = sorted({r["batch"] for r in rows})
    contexts = sorted({r["context"] for r in rows})
    series = theme["series"]
    style = {b: (series[i % len(series)], MARKERS[i % len(MARKERS)]) for i, b in enumerate(batches)}

    ncols = min(len(backends), 3)
    nrows = -(-len(backends) // ncols)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 0.8 + 3.1 * nrows), layout="constrained")
    grid = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    axes = grid.flatten()
    for ax in axes[len(backends):]:
        ax.set_visible(False)
    for ax, backend in zip(axes, backends):
        for batch in batches:
            points = sorted(
                (r["context"], r["bandwidth_tb_s"]) for r in rows if str(r["backend"]) == backend and r["batch"] == batch
            )
            if points:
                color, marker = style[batch]
                ax.plot(*zip(*points), color=color, marker=marker, markersize=4.5, linewidth=1.8)
        if copy:
            ax.axhline(copy, color=theme["fg"], linestyle="--", linewidth=1.2)
        ax.set_title(backend)
        ax.tick_params(axis="x", labelsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [_short_count(int(c)) for c in contexts])
        ax.xaxis.set_minor_locator(NullLocator())
    top = max([copy or 0.0] + [r["bandwidth_tb_s"] for r in rows])
    axes[0].set_ylim(0, top * 1.08)
    for ax in grid[:, 0]:
        ax.set_ylabel("KV read bandwidth (TB/s)")
    if copy:
        axes[0].annotate("device copy (same run)", (0.03, copy), xycoords=("axes fraction", "data"),
                         xytext=(0, 3), textcoords="offset points", fontsize=9, color=theme["muted"])
    fig.get_layout_engine().set(wspace=0.04)
    fig.supxlabel("context length (tokens per request, log scale)", fontsize=10)
    fig.suptitle(f"Decode attention{_on_hardware(data)}: KV-cache read bandwidth")

    handles = [
        Line2D([], [], color=c, marker=m, markersize=4.5, linewidth=1.8, label=f"batch {b}")
        for b, (c, m) in style.items()
    ]
    if copy:
        handles.append(Line2D([], [], color=theme["fg"], linestyle="--", linewidth=1.2,
                              label=f"device copy\n(same run)\n{_number(copy, 'TB/s')}"))
    fig.legend(handles=handles, loc="outside right upper")
    return fig


def attention_section(res: BenchmarkResult) -> list[str] | None:
    """Plot, best bandwidth per backend, and every measured point in a fold-out table."""
    rows = _attention_rows(res.data)
    if rows is None:
        return None
    copy = _copy_bandwidth(res.data)
    out = _attention_headline(res.data)
    out += _plot_markdown(res, "KV read bandwidth against context length, per backend and batch size")
    out += ["| backend | best KV read bandwidth | of device copy bandwidth | reached at |", "|---|---|---:|---|"]
    for backend in dict.fromkeys(str(r["backend"]) for r in rows):
        best = max((r for r in rows if str(r["backend"]) == backend), key=lambda r: r["bandwidth_tb_s"])
        fraction = best.get("fraction_of_copy_bw")
        if not isinstance(fraction, (int, float)):
            fraction = best["bandwidth_tb_s"] / copy if copy else None
        share = f"{fraction:.0%}" if fraction is not None else "—"
        where = f"batch {best['batch']}, context {best['context']:,}"
        out.append(f"| {_md_cell(backend)} | {_number(best['bandwidth_tb_s'], 'TB/s')} | {share} | {where} |")
    if copy:
        out += ["", f"Device copy bandwidth measured in the same run: **{_number(copy, 'TB/s')}**."]
    out += ["", '??? note "All measured points"', ""] + _indent(_rows_table(rows)) + [""]
    return out


def _attention_headline(data: dict) -> list[str]:
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    if config.get("num_qo_heads") and config.get("num_kv_heads") and config.get("head_dim"):
        parts.append(f"{config['num_qo_heads']} query / {config['num_kv_heads']} KV heads × {config['head_dim']}")
    parts += [f"{k.replace('_', ' ')} {_fmt(config[k])}" for k in ("dtype", "page_size") if k in config]
    return [" · ".join(parts), ""] if parts else []
