"""``graphs`` results (CUDA graphs, lesson 8's feature, off and on): batch-size-1 decode against
the roofline, the kernels of one decode step by kind, the captured graphs and the offline
yardstick.

:func:`draw_graphs` draws the chart (a matplotlib figure), :func:`graphs_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

import posixpath
import textwrap
from typing import Any

from .common import (
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _faster,
    _fmt,
    _is_number,
    _label_rows,
    _md_cell,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
    _setup_parts,
)
from .host import _stacked_figure
from .overlap import (
    _decode_fraction,
    _decode_runs,
    _decode_speedup,
    _decode_table,
    _decode_workload,
    _on_off_ratios,
    _paired_yardstick,
    _yardstick_table,
    _yardstick_workload,
)

GRAPHS_RUNS = (("graphs_off", "graphs off"), ("graphs_on", "graphs on"))  # (results key, label)
BUCKETS_SHOWN = 8  # a longer list of captured batch sizes is shortened to its first and last ones


def _graphs_decode(data: dict) -> dict[str, dict] | None:
    """``results.decode``: the shapes with a numeric ms per token with graphs off and on."""
    return _decode_runs(data, GRAPHS_RUNS)


def _graphs_yardstick(data: dict) -> dict[str, Any] | None:
    """The offline yardstick with graphs off and on (see :func:`_paired_yardstick`)."""
    return _paired_yardstick(data, GRAPHS_RUNS)


def _kernel_profile(value: Any) -> dict[str, Any] | None:
    """One profiled decode step: ``{"kernels": kernels per step or None, "us": device µs per
    step, "kinds": {kind: (kernels per step or None, µs per step)}}``; None without a kind that
    has a numeric ``us_per_step``."""
    by_kind = value.get("by_kind") if isinstance(value, dict) else None
    if not isinstance(by_kind, dict):
        return None
    kinds = {
        str(kind): (float(v["kernels_per_step"]) if _is_number(v.get("kernels_per_step")) else None, float(v["us_per_step"]))
        for kind, v in by_kind.items() if isinstance(v, dict) and _is_number(v.get("us_per_step"))
    }
    if not kinds:
        return None
    if _is_number(value.get("kernels_per_step")):
        kernels = float(value["kernels_per_step"])
    elif all(n is not None for n, _ in kinds.values()):
        kernels = sum(n for n, _ in kinds.values())
    else:
        kernels = None
    return {"kernels": kernels, "us": sum(us for _, us in kinds.values()), "kinds": kinds}


def _compared_tree(data: dict) -> str | None:
    """The path of the tree whose eager kernels were counted in the same run, if any."""
    results = data.get("results")
    compared = results.get("kernels_compared_tree") if isinstance(results, dict) else None
    tree = compared.get("tree") if isinstance(compared, dict) else None
    return tree if isinstance(tree, str) and tree else None


def _tree_name(path: str) -> str:
    """``d6784c0``: the last part of a tree's path."""
    return posixpath.basename(path.rstrip("/")) or path


COMPARED_EAGER = "compared_eager"  # the key of the compared tree's eager step in _graphs_kernels


def _graphs_kernels(data: dict) -> dict[str, list[tuple[str, str, dict[str, Any]]]] | None:
    """Per shape, ``(key, label, profile)`` of one decode step at batch size 1 (profile: see
    :func:`_kernel_profile`): the compared tree's eager step (key ``compared_eager``: before
    this tree's fused kernels), then this tree's with graphs off and on (``graphs_off``,
    ``graphs_on``); those the file has. None when no shape has one."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    decode = results.get("decode") if isinstance(results.get("decode"), dict) else {}
    compared = results.get("kernels_compared_tree")
    eager = compared.get("eager") if isinstance(compared, dict) else None
    eager = eager if isinstance(eager, dict) else {}
    tree = _compared_tree(data)
    found = {}
    for shape in dict.fromkeys([*decode, *eager]):
        profiles = []
        before = _kernel_profile(eager.get(shape))
        if before is not None:
            profiles.append((COMPARED_EAGER, f"{_tree_name(tree) if tree else 'compared tree'}, eager", before))
        run = decode.get(shape) if isinstance(decode.get(shape), dict) else {}
        for key, label in GRAPHS_RUNS:
            profile = _kernel_profile(run.get(f"kernels_{key}"))
            if profile is not None:
                profiles.append((key, f"this tree, {label}", profile))
        if profiles:
            found[str(shape)] = profiles
    return found or None


def _kernel_kinds(kernels: dict[str, list[tuple[str, str, dict[str, Any]]]]) -> list[str]:
    """Every kind of kernel in the profiles, the most device time over all of them first."""
    total: dict[str, float] = {}
    for profiles in kernels.values():
        for _, _, profile in profiles:
            for kind, (_, us) in profile["kinds"].items():
                total[kind] = total.get(kind, 0.0) + us
    return sorted(total, key=lambda kind: -total[kind])


def _binary_bytes(n: float) -> str:
    """``1.15 GiB``, ``512 MiB``: a memory size in binary units."""
    for size, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,.0f} B"


def _buckets(v: Any) -> str | None:
    """``1, 2, 4, 8``: the captured batch sizes (a long list shortened), or None."""
    if not isinstance(v, list) or not v or not all(_is_number(b) for b in v):
        return None
    if len(v) > BUCKETS_SHOWN:
        return ", ".join(_fmt(b) for b in v[: BUCKETS_SHOWN - 2]) + f", …, {_fmt(v[-1])} ({len(v)} sizes)"
    return ", ".join(_fmt(b) for b in v)


# A bar of a panel of horizontal bars: (row label, value, colour, label at its end, bold label).
Bar = tuple[str, float, str, str, bool]


def _bar_panels_height(panels: list[tuple[str, list[Bar]]]) -> float:
    """Inches for :func:`_draw_bar_panels`: a title and 0.36 in per bar for each panel."""
    return sum(0.75 + 0.36 * len(bars) for _, bars in panels) + 0.4


def _draw_bar_panels(fig, panels: list[tuple[str, list[Bar]]], xlabel: str) -> None:
    """A panel per ``(title, bars)`` on one shared value axis, each bar horizontal and labelled
    at its end (see :data:`Bar`)."""
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    top = 0.0
    for ax, (title, bars) in zip(axes, panels):
        values = [value for _, value, _, _, _ in bars]
        ax.barh(range(len(bars)), values, height=0.64, color=[color for _, _, color, _, _ in bars])
        for yi, (_, value, _, text, bold) in enumerate(bars):
            ax.annotate(text, (value, yi), xytext=(6, 0), textcoords="offset points", va="center",
                        fontsize=9, fontweight="bold" if bold else "normal")
        top = max(top, *values)
        _label_rows(ax, [label for label, _, _, _, _ in bars])
        ax.set_title(title, loc="left")
    axes[0].set_xlim(0, top * 1.45 or 1.0)  # room for the labels of the longest bars
    axes[-1].set_xlabel(xlabel)


def _roofline_bar(run: dict, fraction: float | None, theme: dict[str, Any], reach: str) -> list[Bar]:
    """The HBM roofline's bar of a decode run, labelled with the ``fraction`` of it that the
    setting named ``reach`` reaches; none without a roofline."""
    if not _is_number(run.get("roofline_ms")):
        return []
    text = _number(run["roofline_ms"], "ms")
    if fraction is not None:
        text += f"   ({reach} reach {fraction:.0%} of it)"
    return [("HBM roofline", float(run["roofline_ms"]), theme["series"][2], text, False)]


def _graphs_decode_panels(decode: dict[str, dict], theme: dict[str, Any]) -> list[tuple[str, list[Bar]]]:
    """A panel per shape: ms per token with graphs off and on (labelled with the speed-up) and
    the roofline (labelled with the share of it that graphs on reach)."""
    panels = []
    for shape, run in decode.items():
        on, speedup = _number(run["graphs_on"], "ms"), _decode_speedup(run, GRAPHS_RUNS)
        if speedup is not None:
            on += f"   →  {_faster(speedup)}"
        bars = [("graphs off (eager)", float(run["graphs_off"]), theme["other"], _number(run["graphs_off"], "ms"), False),
                ("graphs on", float(run["graphs_on"]), theme["accent"], on, True)]
        bars += _roofline_bar(run, _decode_fraction(run, GRAPHS_RUNS), theme, "graphs on")
        panels.append((f"{shape}: decode at batch size 1", bars))
    return panels


def _decode_xlabel(panels: list[tuple[str, list[Bar]]], roofline: str) -> str:
    """The axis label of decode panels; how the roofline is drawn (``roofline``: the bytes) when
    a panel has one."""
    drawn = any(label == "HBM roofline" for _, bars in panels for label, _, _, _, _ in bars)
    return "ms per output token (lower is better)" + (f"; roofline: {roofline} / copy bandwidth" if drawn else "")


def _draw_graphs_kernels(fig, kernels: dict[str, list[tuple[str, str, dict[str, Any]]]], theme: dict[str, Any]) -> None:
    """A panel per shape, a horizontal bar per profiled step (compared tree eager, graphs off,
    graphs on): device µs per step stacked by kind of kernel, labelled with the kernel count."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import StrMethodFormatter

    kinds = _kernel_kinds(kernels)
    palette = list(theme["series"]) + [theme["other"]]
    # more kinds than colours: the colours again, lighter
    styles = {kind: (palette[i % len(palette)], 1.0 if i < len(palette) else 0.45) for i, kind in enumerate(kinds)}
    axes = fig.subplots(len(kernels), 1, squeeze=False)[:, 0]
    for ax, (shape, profiles) in zip(axes, kernels.items()):
        y = list(range(len(profiles)))
        for yi, (_, _, profile) in zip(y, profiles):
            left = 0.0
            for kind in kinds:
                if kind in profile["kinds"]:
                    us = profile["kinds"][kind][1]
                    color, alpha = styles[kind]
                    ax.barh(yi, us, left=left, height=0.64, color=color, alpha=alpha, linewidth=0)
                    left += us
            text = _number(profile["us"], "µs")
            if profile["kernels"] is not None:
                text = f"{_number(profile['kernels'])} kernels, {text}"
            ax.annotate(text, (left, yi), xytext=(5, 0), textcoords="offset points", va="center", fontsize=8.5)
        _label_rows(ax, [label for _, label, _ in profiles])
        ax.set_xlim(0, max(p["us"] for _, _, p in profiles) * 1.3 or 1.0)  # room for the labels
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.set_title(f"{shape}: kernels of one decode step at batch size 1, by kind", loc="left")
    axes[-1].set_xlabel("device µs per decode step (kernel time, summed)")
    labels, ncols, _ = _legend_layout(kinds)
    fig.legend(handles=[Patch(color=styles[kind][0], alpha=styles[kind][1], label=label) for kind, label in zip(kinds, labels)],
               loc="outside lower center", ncols=ncols)


LEGEND_WRAP = 36  # legend labels longer than this many characters are wrapped
# A legend entry's width (inches) at the legend's font size: per character, and per column for
# the patch and the gaps (measured on the kernel legends of the committed results).
LEGEND_CHAR_IN, LEGEND_COLUMN_IN = 0.062, 0.64


def _legend_layout(labels: list[str], max_cols: int = 4) -> tuple[list[str], int, float]:
    """A legend as wide as the plot at most: the labels wrapped at :data:`LEGEND_WRAP`, the most
    columns (up to ``max_cols``) whose estimated width fits, and the legend's height in inches."""
    wrapped = ["\n".join(textwrap.wrap(label, LEGEND_WRAP)) or label for label in labels]
    lines = [label.count("\n") + 1 for label in wrapped]
    widths = [max(len(line) for line in label.split("\n")) * LEGEND_CHAR_IN for label in wrapped]
    for ncols in range(min(max_cols, len(labels)), 0, -1):
        # matplotlib fills the columns top to bottom, the first ones one entry longer
        rows, longer = divmod(len(labels), ncols)
        sizes = [rows + 1] * longer + [rows] * (ncols - longer)
        columns = [range(sum(sizes[:c]), sum(sizes[:c + 1])) for c in range(ncols)]
        if ncols == 1 or sum(max(widths[i] for i in col) + LEGEND_COLUMN_IN for col in columns) <= PLOT_WIDTH_IN:
            break
    height = 0.3 * max(sizes) + 0.17 * max(sum(lines[i] - 1 for i in col) for col in columns)
    return wrapped, ncols, height


def _kernels_height(kernels: dict[str, list[tuple[str, str, dict[str, Any]]]]) -> float:
    """Inches for :func:`_draw_graphs_kernels`: 0.36 in per profiled step, and the legend."""
    return sum(0.75 + 0.36 * len(p) for p in kernels.values()) + _legend_layout(_kernel_kinds(kernels))[2] + 0.5


def draw_graphs(data: dict, theme: dict[str, Any]):
    """Batch-size-1 decode per shape with graphs off and on against the roofline (above), and
    the kernels of one decode step by kind (below); either alone when the file has only one."""
    decode, kernels = _graphs_decode(data), _graphs_kernels(data)
    if decode is None and kernels is None:
        return None
    parts = []
    if decode is not None:
        panels, xlabel = _graphs_decode_panels(decode, theme), "bytes read per step"
        parts.append((_bar_panels_height(panels), lambda panel: _draw_bar_panels(panel, panels, _decode_xlabel(panels, xlabel))))
    if kernels is not None:
        parts.append((_kernels_height(kernels), lambda panel: _draw_graphs_kernels(panel, kernels, theme)))
    return _stacked_figure(parts, f"CUDA graphs off and on{_on_hardware(data)}")


def graphs_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the ratios, the plot, the decode table with the captured graphs, the
    kernels per step by kind and the yardstick's repeats; None when the file has none of them."""
    data = res.data
    decode, kernels, yard = _graphs_decode(data), _graphs_kernels(data), _graphs_yardstick(data)
    if decode is None and kernels is None and yard is None:
        return None
    out = _graphs_headline(data)
    if decode is not None or kernels is not None:
        out += _plot_markdown(res, "Batch-size-1 decode with CUDA graphs off and on against the roofline, "
                                   "and the kernels of one decode step by kind")
    if decode is not None:
        out += ["**Decode at batch size 1**, ms per output token:", ""] + _decode_table(data, decode, GRAPHS_RUNS, "graphs")
        out += _captured_graphs_table(decode)
    if kernels is not None:
        out += ["", KERNELS_HEAD.format(settings=""), ""] + _graphs_kernels_table(data, kernels)
    timeline = _bs1_timeline_table(data["results"].get("bs1_timeline"))
    out += timeline
    if yard is not None:
        out += ["", "**Offline yardstick**, output tokens per second with graphs off and on:", ""]
        out += _yardstick_table(yard, GRAPHS_RUNS)
    results = data["results"]
    shown = {"copy_bandwidth_bytes_s"} | ({"bs1_timeline"} if timeline else set())
    shown |= {"decode"} if decode is not None else set()
    shown |= {"kernels_compared_tree"} if kernels is not None else set()
    shown |= {"yardstick"} if yard is not None else set()
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


TIMELINE_COLUMNS = ("process", "ms/token", "graph alone", "graph served", "between graphs", "host lead",
                    "host behind", "host cycle", "schedule · launch · process", "CPU core · SM clock")


def _bs1_timeline_table(timeline: Any) -> list[str]:
    """``--timeline-processes``: a row per fresh process, where its bs=1 steps' time went; [] when
    the file has none (or an older layout)."""
    if not isinstance(timeline, dict) or not isinstance(timeline.get("processes"), list):
        return []
    runs = [r for r in timeline["processes"] if isinstance(r, dict) and {"replays", "host_ms"} <= r.keys()]
    if not runs:
        return []
    out = ["", f"**Where a bs=1 step's time goes with graphs** ({_md_cell(str(timeline.get('shape', '')))}), one row per "
           "fresh process, ms:", "", "| " + " | ".join(TIMELINE_COLUMNS) + " |", "|---|" + "---:|" * (len(TIMELINE_COLUMNS) - 1)]
    def ms(v: Any) -> str:
        return f"{v:.2f}" if _is_number(v) else "—"

    for i, run in enumerate(runs):
        seen, host = run["replays"], run["host_ms"]
        behind = seen.get("host_behind_fraction")
        cells = [str(i), ms(run.get("ms_per_token")), ms(run.get("replay_alone_ms")), ms(seen.get("graph_ms")),
                 ms(seen.get("between_ms")), ms(seen.get("host_lead_ms")), f"{behind:.0%}" if _is_number(behind) else "—",
                 ms(host.get("cycle")), " · ".join(ms(host.get(k)) for k in ("schedule", "launch", "process")),
                 f"{run.get('cpu_core', '—')} · {run.get('sm_clock_mhz') or '—'} MHz"]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", TIMELINE_NOTE]


TIMELINE_NOTE = (
    "Graph alone: the 1-row graph replayed back to back with nothing else, over a one-token context (the "
    "scratch page); served: the same graph between CUDA events while the engine decodes, and the device's time "
    "from one graph's end to the next one's start; host lead: how long before the previous graph ended the host "
    "called the next replay (negative: the device waited for the host), and the share of steps where the host "
    "was behind; schedule · launch · process: the host's phases of a step (process waits for the step's tokens).")


KERNELS_HEAD = ("**Kernels of one decode step at batch size 1**, by kind{settings}: kernels per step · device µs per "
                "step (the kernels' own time, summed; the profiler's mean over the profiled steps):")


def _captured_graphs_table(decode: dict[str, dict]) -> list[str]:
    """One row per shape with the graphs of its graphs-on run: batch sizes, memory, start-up."""
    keys = ("buckets", "graph_memory_bytes", "startup_s_with_capture")
    if not any(k in run for run in decode.values() for k in keys):
        return []
    out = ["", "**The captured graphs** of the graphs-on runs:", "",
           "| shape | captured batch sizes | graph memory | start-up with capture |", "|---|---|---:|---:|"]
    for shape, run in decode.items():
        memory, startup = run.get("graph_memory_bytes"), run.get("startup_s_with_capture")
        cells = [
            _md_cell(str(shape)),
            _buckets(run.get("buckets")) or "—",
            _binary_bytes(memory) if _is_number(memory) else "—",
            _number(startup, "s") if _is_number(startup) else "—",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "Graph memory: the device memory the captures took (measured before the KV pool is sized); "
                  "start-up: the engine's whole start, weights and captures included. A decode batch is padded "
                  "to the next captured batch size."]


def _graphs_kernels_table(data: dict, kernels: dict[str, list[tuple[str, str, dict[str, Any]]]]) -> list[str]:
    """:func:`_kernels_table` of the graphs benchmark (each step's share of the ms per token of
    its shape and setting), then the compared tree."""
    decode = _graphs_decode(data) or {}
    out = _kernels_table(kernels, lambda shape, key: decode.get(shape, {}).get(key))
    tree = _compared_tree(data)
    if tree:
        out += ["", f"`{_md_cell(tree)}`: the tree whose eager decode step was profiled in the same run, "
                f"for the kernels before this tree's fused ones."]
    return out


def _kernels_table(kernels: dict[str, list[tuple[str, str, dict[str, Any]]]], ms_per_token) -> list[str]:
    """A table per shape: a row per kind of kernel (most device time first), a column per
    profiled step, then the totals, and the kernels' share of ``ms_per_token(shape, key)`` (the
    step's unprofiled ms per token, or None)."""
    out: list[str] = []
    kinds = _kernel_kinds(kernels)
    shares = False

    def cell(kernel_count: float | None, us: float, bold: bool = False) -> str:
        text = (f"{_number(kernel_count)} · " if kernel_count is not None else "— · ") + _number(us, "µs")
        return f"**{text}**" if bold else text

    for shape, profiles in kernels.items():
        out += ([""] if out else []) + [f"_{_md_cell(shape)}_", ""]
        out += ["| kind | " + " | ".join(_md_cell(label) for _, label, _ in profiles) + " |", "|---|" + "---:|" * len(profiles)]
        for kind in kinds:
            if any(kind in p["kinds"] for _, _, p in profiles):
                cells = [cell(*p["kinds"][kind]) if kind in p["kinds"] else "—" for _, _, p in profiles]
                out.append(f"| {_md_cell(kind)} | " + " | ".join(cells) + " |")
        out.append("| all kernels | " + " | ".join(cell(p["kernels"], p["us"], bold=True) for _, _, p in profiles) + " |")
        ms = [ms_per_token(shape, key) for key, _, _ in profiles]
        busy = [f"{p['us'] / (1e3 * m):.0%} of {_number(m, 'ms')}" if _is_number(m) and m > 0 else "—"
                for m, (_, _, p) in zip(ms, profiles)]
        if any(b != "—" for b in busy):
            out.append("| kernel time, share of the ms per token | " + " | ".join(busy) + " |")
            shares = True
    if shares:
        out += ["", "The share: the kernels' summed time over the batch-size-1 ms per token measured without "
                "the profiler (the decode table); for the rest of a token's time, none of its kernels runs on the device."]
    return out


def _graphs_headline(data: dict) -> list[str]:
    """The workloads on one line; on the next, graphs on against off, and the kernels per
    eager step before and after this tree's fused kernels."""
    config = _config(data)
    parts = _setup_parts(config)
    parts += [w for w in (_decode_workload(config), _yardstick_workload(config)) if w]
    if config.get("overlap") is True:
        parts.append("overlap scheduling on in every run")
    out = [" · ".join(parts), ""] if parts else []
    lines = []
    ratios = _on_off_ratios(_graphs_decode(data), _graphs_yardstick(data), GRAPHS_RUNS)
    if ratios:
        lines.append("CUDA graphs on against off: " + "; ".join(ratios) + ".")
    kernels = _graphs_kernels(data) or {}
    fused = []
    for shape, profiles in kernels.items():
        by_key = {key: profile for key, _, profile in profiles}
        before, after = by_key.get(COMPARED_EAGER), by_key.get("graphs_off")
        if before is not None and after is not None and before["kernels"] is not None and after["kernels"] is not None:
            fused.append(f"**{_number(before['kernels'])} → {_number(after['kernels'])}** ({_md_cell(shape)})")
    tree = _compared_tree(data)
    if fused and tree:
        lines.append(f"Kernels per eager decode step, `{_md_cell(_tree_name(tree))}` → this tree: " + ", ".join(fused) + ".")
    return out + ([" ".join(lines), ""] if lines else [])
