"""``host`` results (host time per decode step, lesson 7's concern): the scheduler's, per load and
tree, and a profile of one decode step at batch size 1.

:func:`draw_host` draws the chart (a matplotlib figure), :func:`host_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from .common import (
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _fmt,
    _is_number,
    _md_cell,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
    _setup_parts,
)

HOST_SETTINGS = {"overlap_off": "overlap off", "overlap_on": "overlap on", "synchronous": "synchronous"}


def _host_scheduler(data: dict) -> list[dict[str, Any]] | None:
    """One entry per measured (tree, load, setting) with a numeric ``schedule_ms`` and
    ``process_ms``: ``{"tree", "path", "load", "setting", "schedule_ms", "process_ms", "run"}``."""
    results = data.get("results")
    scheduler = results.get("scheduler") if isinstance(results, dict) else None
    if not isinstance(scheduler, dict):
        return None
    found = []
    for tree, loads in scheduler.items():
        if not isinstance(loads, dict):
            continue
        path = loads.get("tree") if isinstance(loads.get("tree"), str) else None
        for load, settings in loads.items():
            if load == "tree" or not isinstance(settings, dict):
                continue
            for setting, run in settings.items():
                if isinstance(run, dict) and _is_number(run.get("schedule_ms")) and _is_number(run.get("process_ms")):
                    found.append({"tree": str(tree), "path": path, "load": str(load), "setting": str(setting),
                                  "schedule_ms": float(run["schedule_ms"]), "process_ms": float(run["process_ms"]),
                                  "run": run})
    return found or None


def _load_label(load: str) -> str:
    """``32 × 1,024``: a ``32x1024`` load (requests × prompt length)."""
    m = re.fullmatch(r"(\d+)x(\d+)", load)
    return f"{int(m.group(1)):,} × {int(m.group(2)):,}" if m else load


def _host_series_label(tree: str, setting: str) -> str:
    """``this tree, overlap on``; a compared tree named by the last part of its path."""
    if tree.startswith("compare: "):
        tree = "compare: " + (posixpath.basename(tree[len("compare: "):].rstrip("/")) or tree[len("compare: "):])
    return f"{tree}, {HOST_SETTINGS.get(setting, setting)}"


def _host_profile(data: dict) -> dict[str, Any] | None:
    """``results.bs1_profile`` with its usable rows, each ``(depth, label, ms per step, calls
    per step or None)`` (depth: the label's leading spaces, two per level); None without rows."""
    results = data.get("results")
    profile = results.get("bs1_profile") if isinstance(results, dict) else None
    rows = profile.get("rows") if isinstance(profile, dict) else None
    if not isinstance(rows, list):
        return None
    kept = []
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("what"), str) and _is_number(row.get("ms_per_step")):
            what = row["what"]
            depth = (len(what) - len(what.lstrip(" "))) // 2
            calls = float(row["calls_per_step"]) if _is_number(row.get("calls_per_step")) else None
            kept.append((depth, what.strip(), float(row["ms_per_step"]), calls))
    if not kept:
        return None
    return {
        "rows": kept,
        "profiled": float(profile["profiled_ms_per_step"]) if _is_number(profile.get("profiled_ms_per_step")) else None,
        "unprofiled": float(profile["unprofiled_ms_per_token"]) if _is_number(profile.get("unprofiled_ms_per_token")) else None,
        "tokens": profile.get("tokens") if _is_number(profile.get("tokens")) else None,
    }


def _draw_host_scheduler(fig, entries: list[dict[str, Any]], theme: dict[str, Any]) -> None:
    """Grouped bars, a group per load and a bar per (tree, setting): schedule below, process
    (lighter) on top, each bar labelled with the sum."""
    from matplotlib.patches import Patch

    loads = list(dict.fromkeys(e["load"] for e in entries))
    series = list(dict.fromkeys((e["tree"], e["setting"]) for e in entries))
    by_key = {(e["load"], e["tree"], e["setting"]): e for e in entries}
    colors = {s: theme["series"][i % len(theme["series"])] for i, s in enumerate(series)}
    ax = fig.subplots()
    width = min(0.76 / len(series), 0.22)  # one load alone does not get bars as wide as the plot
    top = 0.0
    for i, s in enumerate(series):
        for xi, load in enumerate(loads):
            e = by_key.get((load, *s))
            if e is None:
                continue
            x = xi + (i - (len(series) - 1) / 2) * width
            total = e["schedule_ms"] + e["process_ms"]
            ax.bar(x, e["schedule_ms"], width=width * 0.92, color=colors[s])
            ax.bar(x, e["process_ms"], bottom=e["schedule_ms"], width=width * 0.92, color=colors[s], alpha=0.45)
            ax.annotate(_number(total), (x, total), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8.5)
            top = max(top, total)
    ax.set_ylim(0, top * 1.18 or 1.0)
    ax.set_xlim(-0.5, len(loads) - 0.5)
    ax.set_xticks(range(len(loads)), [_load_label(load) for load in loads])
    ax.set_xlabel("load: decoding requests × prompt tokens")
    ax.set_ylabel("host ms per decode step")
    ax.set_axisbelow(True)
    ax.tick_params(axis="x", length=0)
    ax.grid(axis="x", visible=False)
    ax.set_title("Scheduler host time per decode step (lower is better)", loc="left")
    handles = [Patch(color=colors[s], label=_host_series_label(*s)) for s in series]
    handles += [Patch(color=theme["muted"], label="schedule"), Patch(color=theme["muted"], alpha=0.45, label="process (on top)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _draw_host_profile(fig, profile: dict[str, Any], theme: dict[str, Any]) -> None:
    """Horizontal bars of ms per step: the whole step first (profiled, and not profiled when
    the file has it), then one bar per profiled part, its label indented by depth."""
    wholes = [(label, ms) for label, ms in (("whole step, profiled", profile["profiled"]),
                                            ("whole step, not profiled", profile["unprofiled"])) if ms]
    rows = [(0, label, ms, None) for label, ms in wholes] + profile["rows"]
    labels_ax, ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 1.9], "wspace": 0.0})
    y = list(range(len(rows)))
    values = [ms for _, _, ms, _ in rows]
    bars = ax.barh(y, values, height=0.66, color=theme["accent"])
    for i, (bar, (depth, _, _, _)) in enumerate(zip(bars, rows)):
        if i < len(wholes):
            bar.set_color(theme["other"])
        else:
            bar.set_alpha(max(1.0 - 0.3 * depth, 0.3))  # a part inside another in a lighter shade
    ax.set_ylim(len(rows) - 0.5, -0.5)
    labels_ax.axis("off")
    for i, (yi, (depth, label, _, _)) in enumerate(zip(y, rows)):
        whole = i < len(wholes)
        labels_ax.text(0.02 + 0.07 * depth, yi, label, transform=labels_ax.get_yaxis_transform(), va="center",
                       ha="left", fontweight="bold" if depth == 0 and not whole else "normal",
                       color=theme["muted"] if whole else theme["fg"])
    for yi, value in zip(y, values):
        ax.annotate(_number(value, "ms"), (value, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5)
    ax.set_xlim(0, max(values) * 1.14 or 1.0)
    ax.tick_params(axis="y", length=0, labelleft=False)
    ax.grid(axis="y", visible=False)
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("ms per decode step at batch size 1")
    ax.set_axisbelow(True)
    labels_ax.set_title("One decode step at batch size 1, by part (indented: inside the part above)", loc="left")


def _stacked_figure(parts: list[tuple[float, Any]], title: str) -> Any:
    """One matplotlib figure of panels stacked top to bottom: ``parts`` is ``[(height in inches,
    draw)]``, each ``draw(panel)`` filling its panel (the figure itself when there is only one)."""
    from matplotlib.figure import Figure

    heights = [height for height, _ in parts]
    fig = Figure(figsize=(PLOT_WIDTH_IN, sum(heights) + 0.4), layout="constrained")
    panels = list(fig.subfigures(len(parts), 1, height_ratios=heights)) if len(parts) > 1 else [fig]
    for panel, (_, draw) in zip(panels, parts):
        draw(panel)
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def draw_host(data: dict, theme: dict[str, Any]):
    """The scheduler's host ms per decode step per load (above) and the profile of one
    batch-size-1 decode step (below); either alone when the file has only one of them."""
    entries, profile = _host_scheduler(data), _host_profile(data)
    if entries is None and profile is None:
        return None
    parts = []
    if entries is not None:
        parts.append((3.0, lambda panel: _draw_host_scheduler(panel, entries, theme)))
    if profile is not None:
        parts.append((0.9 + 0.27 * len(profile["rows"]), lambda panel: _draw_host_profile(panel, profile, theme)))
    return _stacked_figure(parts, f"Host time per decode step{_on_hardware(data)}")


def host_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the totals, the plot, the scheduler table and the profile table."""
    data = res.data
    entries, profile = _host_scheduler(data), _host_profile(data)
    if entries is None and profile is None:
        return None
    out = _host_headline(data)
    out += _plot_markdown(res, "Scheduler host time per decode step per load, and a profile of one batch-size-1 decode step")
    if entries is not None:
        out += ["**Scheduler host time per decode step**, mean over the decode steps of each run:", ""]
        out += _host_scheduler_table(entries)
    if profile is not None:
        out += ([""] if entries is not None else []) + ["**One decode step at batch size 1, profiled by part:**", ""]
        out += _host_profile_table(profile)
    results = data["results"]
    shown = ({"scheduler"} if entries is not None else set()) | ({"bs1_profile"} if profile is not None else set())
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _host_scheduler_table(entries: list[dict[str, Any]]) -> list[str]:
    out = [
        "| tree | load | setting | decode steps | schedule | process | host total |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for e in entries:
        # "compare: <path>" names the tree already
        shown = e["path"] and posixpath.basename(e["path"].rstrip("/")) not in e["tree"]
        tree = _md_cell(e["tree"]) + (f" (`{_md_cell(e['path'])}`)" if shown else "")
        steps = e["run"].get("decode_steps")
        cells = [
            tree,
            _load_label(e["load"]),
            HOST_SETTINGS.get(e["setting"], _md_cell(e["setting"])),
            _fmt(steps) if _is_number(steps) else "—",
            _number(e["schedule_ms"], "ms"),
            _number(e["process_ms"], "ms"),
            f"**{_number(e['schedule_ms'] + e['process_ms'], 'ms')}**",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "Load: decoding requests × prompt tokens."]


def _host_profile_table(profile: dict[str, Any]) -> list[str]:
    total = profile["profiled"]
    out = ["| part of the step | ms per step | calls per step | share of the profiled step |", "|---|---:|---:|---:|"]
    for depth, label, ms, calls in profile["rows"]:
        indent = "&nbsp;" * 6 * depth + ("└ " if depth else "")
        name = _md_cell(label) if depth else f"**{_md_cell(label)}**"
        share = f"{ms / total:.1%}" if total else "—"
        out.append(f"| {indent}{name} | {_number(ms, 'ms')} | {_number(calls) if calls is not None else '—'} | {share} |")
    if total:
        out.append(f"| whole step, profiled | **{_number(total, 'ms')}** | | 100% |")
    if profile["unprofiled"]:
        out.append(f"| whole step, not profiled (ms per token) | **{_number(profile['unprofiled'], 'ms')}** | | |")
    return out


def _host_headline(data: dict) -> list[str]:
    """The setup and the loads on one line; on the next, the host total of each series per load
    and the batch-size-1 step."""
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    parts += _setup_parts(config)
    entries, profile = _host_scheduler(data), _host_profile(data)
    if entries is not None:
        parts.append("loads " + ", ".join(_load_label(load) for load in dict.fromkeys(e["load"] for e in entries))
                     + " (decoding requests × prompt tokens)")
    if _is_number(config.get("new_tokens")):
        parts.append(f"{config['new_tokens']:,} new tokens per request")
    if profile is not None and profile["tokens"]:
        parts.append(f"batch-size-1 profile over {profile['tokens']:,} tokens")
    out = [" · ".join(parts), ""] if parts else []
    lines, per_load = [], []
    for load in dict.fromkeys(e["load"] for e in entries or []):
        totals = [f"**{_number(e['schedule_ms'] + e['process_ms'], 'ms')}** ({_host_series_label(e['tree'], e['setting'])})"
                  for e in entries if e["load"] == load]
        per_load.append(f"at {_load_label(load)}, " + ", ".join(totals))
    if per_load:
        lines.append("Scheduler host time per decode step: " + "; ".join(per_load) + ".")
    if profile is not None and profile["unprofiled"]:
        lines.append(f"A decode step at batch size 1: **{_number(profile['unprofiled'], 'ms')}** per token, not profiled.")
    return out + ([" ".join(lines), ""] if lines else [])
