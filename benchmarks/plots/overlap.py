"""``overlap`` results (overlap scheduling, lesson 7's feature, off and on): a traced timeline,
batch-size-1 decode and the offline yardstick.

:func:`draw_overlap` draws the chart (a matplotlib figure), :func:`overlap_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

import re
from typing import Any

from .common import (
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _fmt,
    _indent,
    _is_number,
    _label_rows,
    _md_cell,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
    _rows_table,
    _setup_parts,
)

OVERLAP_RUNS = (("overlap_off", "overlap off"), ("overlap_on", "overlap on"))  # (results key, label)
# (key of a traced step, lane label), top to bottom: the host's three parts of a step, then the
# device's work (traced on CUDA only).
TIMELINE_LANES = (
    ("schedule", "host: schedule"),
    ("launch", "host: launch"),
    ("process", "host: process"),
    ("device", "device"),
)
TIMELINE_MIN_WIDTH = 0.004  # spans shorter than this share of the time axis are drawn this wide


def _span(v: Any) -> tuple[float, float] | None:
    """``(start, end)`` of a ``[start, end]`` pair of numbers, or None."""
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(x) for x in v) and v[1] >= v[0]:
        return float(v[0]), float(v[1])
    return None


def _overlap_timeline(data: dict) -> dict[str, list[dict[str, tuple[float, float]]]] | None:
    """``{"overlap_off": steps, "overlap_on": steps}``, each step ``{lane: (start ms, end ms)}``
    with its well-formed spans; None unless both runs have a traced step."""
    results = data.get("results")
    timeline = results.get("timeline") if isinstance(results, dict) else None
    steps = timeline.get("steps") if isinstance(timeline, dict) else None
    if not isinstance(steps, dict):
        return None
    out = {}
    for key, _ in OVERLAP_RUNS:
        traced = steps.get(key)
        kept = []
        for step in traced if isinstance(traced, list) else []:
            if isinstance(step, dict):
                spans = {lane: _span(step.get(lane)) for lane, _ in TIMELINE_LANES}
                if any(spans.values()):
                    kept.append({lane: s for lane, s in spans.items() if s is not None})
        if not kept:
            return None
        out[key] = kept
    return out


def _step_start(step: dict[str, tuple[float, float]]) -> float:
    return min(s[0] for s in step.values())


def _step_period(steps: list[dict[str, tuple[float, float]]]) -> float:
    """ms per step: from the first step's start to the last one's, over the steps in between (the
    last step's end is no measure with overlap on: its process waits for a launch not traced)."""
    if len(steps) >= 2:
        return (_step_start(steps[-1]) - _step_start(steps[0])) / (len(steps) - 1)
    return max(s[1] for s in steps[0].values()) - _step_start(steps[0])


def _timeline_end_per_step(steps: list[dict[str, tuple[float, float]]]) -> float:
    """The last process end (else the last end of any span) over the number of steps."""
    ends = [step["process"][1] for step in steps if "process" in step]
    end = ends[-1] if ends else max(s[1] for step in steps for s in step.values())
    return (end - _step_start(steps[0])) / len(steps)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _timeline_stats(steps: list[dict[str, tuple[float, float]]]) -> dict[str, float | None]:
    """Mean length of each lane's spans, and the device's mean idle gap between two steps."""
    stats = {lane: _mean([step[lane][1] - step[lane][0] for step in steps if lane in step]) for lane, _ in TIMELINE_LANES}
    device = [step["device"] for step in steps if "device" in step]
    stats["device_gap"] = _mean([b[0] - a[1] for a, b in zip(device, device[1:])]) if len(device) >= 2 else None
    return stats


def _timeline_meta(data: dict) -> dict:
    results = data.get("results")
    timeline = results.get("timeline") if isinstance(results, dict) else None
    return timeline if isinstance(timeline, dict) else {}


def _timeline_workload(data: dict) -> str:
    """``32 decoding requests with 256-token prompts (tiny)``, from the timeline's own keys."""
    meta = _timeline_meta(data)
    text = f"{meta['requests']:,} decoding requests" if _is_number(meta.get("requests")) else "decoding requests"
    if _is_number(meta.get("prompt_len")):
        text += f" with {meta['prompt_len']:,}-token prompts"
    if meta.get("shape"):
        text += f" ({meta['shape']})"
    return text


def draw_overlap(data: dict, theme: dict[str, Any]):
    """The traced timeline: one panel per run (overlap off above, on below) on one time axis,
    a lane per part of a step (the host's schedule, launch and process, the device's work),
    one bar per step in it, every other step in a lighter shade."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    timeline = _overlap_timeline(data)
    if timeline is None:
        return None
    lanes = [(lane, label) for lane, label in TIMELINE_LANES
             if any(lane in step for steps in timeline.values() for step in steps)]
    colors = {lane: theme["series"][i % len(theme["series"])] for i, (lane, _) in enumerate(TIMELINE_LANES)}
    start = min(_step_start(steps[0]) for steps in timeline.values())
    end = max(s[1] for steps in timeline.values() for step in steps for s in step.values())
    min_width = TIMELINE_MIN_WIDTH * (end - start or 1.0)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 1.5 + 2 * (0.34 * len(lanes) + 0.45)), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (key, label) in zip(axes, OVERLAP_RUNS):
        steps = timeline[key]
        for row, (lane, _) in enumerate(lanes):
            for i, step in enumerate(steps):
                if lane in step:
                    t0, t1 = step[lane]
                    ax.broken_barh([(t0, max(t1 - t0, min_width))], (row - 0.36, 0.72),
                                   color=colors[lane], alpha=1.0 if i % 2 == 0 else 0.5, linewidth=0)
        _label_rows(ax, [lane_label for _, lane_label in lanes])
        ax.set_title(f"{label}: {_number(_step_period(steps), 'ms')} per step ({len(steps)} traced steps)", loc="left")
    axes[0].set_xlim(start, start + (end - start) * 1.01 or 1.0)
    axes[-1].xaxis.set_major_locator(MaxNLocator(12))
    axes[-1].set_xlabel("time since the first traced step started (ms)")
    fig.suptitle(f"Overlap scheduling{_on_hardware(data)}: {_timeline_workload(data)}", x=0.01, ha="left")
    return fig


def _decode_runs(data: dict, runs: tuple = OVERLAP_RUNS) -> dict[str, dict] | None:
    """``results.decode``: the shapes with a numeric ms per token with both settings of ``runs``
    (``(off key, label), (on key, label)``: overlap's by default)."""
    results = data.get("results")
    decode = results.get("decode") if isinstance(results, dict) else None
    if not isinstance(decode, dict):
        return None
    usable = {shape: run for shape, run in decode.items()
              if isinstance(run, dict) and all(_is_number(run.get(key)) for key, _ in runs)}
    return usable or None


def _overlap_decode(data: dict) -> dict[str, dict] | None:
    """``results.decode``: the shapes with a numeric ms per token with overlap off and on."""
    return _decode_runs(data, OVERLAP_RUNS)


def _decode_speedup(run: dict, runs: tuple = OVERLAP_RUNS) -> float | None:
    """ms per token off over on (above 1: on is faster): the file's, else computed."""
    if _is_number(run.get("speedup")):
        return float(run["speedup"])
    (off, _), (on, _) = runs
    return run[off] / run[on] if run[on] else None


def _decode_fraction(run: dict, runs: tuple = OVERLAP_RUNS) -> float | None:
    """The roofline's ms per token over the measured one with the setting on: the file's, else computed."""
    if _is_number(run.get("fraction_of_roofline")):
        return float(run["fraction_of_roofline"])
    on = runs[1][0]
    if _is_number(run.get("roofline_ms")) and run[on]:
        return run["roofline_ms"] / run[on]
    return None


def _bytes(n: float) -> str:
    """``1.22 GB``, ``698 kB``: a byte count in decimal units."""
    for size, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,.0f} B"


def _overlap_yardstick(data: dict) -> dict[str, Any] | None:
    """The offline yardstick with overlap off and on (see :func:`_paired_yardstick`)."""
    return _paired_yardstick(data, OVERLAP_RUNS)


def _paired_yardstick(data: dict, runs: tuple) -> dict[str, Any] | None:
    """The offline yardstick of a setting off and on (``runs``: ``(off key, label), (on key,
    label)``): ``{"pairs": [(off run, on run, on/off ratio)], "median": ratio}``.

    Newer files hold a list of runs per setting (repeats interleaved), ``speedups`` (one ratio
    per repeat) and ``speedup`` (their median); older ones a single run per setting and its
    ``speedup``. A ratio the file lacks is computed from ``output_tok_s``. None without runs
    and without a ratio."""
    results = data.get("results")
    yard = results.get("yardstick") if isinstance(results, dict) else None
    if not isinstance(yard, dict):
        return None
    measured = []
    for key, _ in runs:
        value = yard.get(key)
        value = [value] if isinstance(value, dict) else value
        measured.append([r for r in value if isinstance(r, dict)] if isinstance(value, list) else [])
    given = yard.get("speedups") if isinstance(yard.get("speedups"), list) else []
    pairs = []
    for i, (off, on) in enumerate(zip(*measured)):
        ratio = None
        if i < len(given) and _is_number(given[i]):
            ratio = float(given[i])
        elif _is_number(off.get("output_tok_s")) and _is_number(on.get("output_tok_s")) and off["output_tok_s"]:
            ratio = on["output_tok_s"] / off["output_tok_s"]
        pairs.append((off, on, ratio))
    if len(pairs) == 1 and _is_number(yard.get("speedup")) and "speedups" not in yard:
        pairs[0] = (*pairs[0][:2], float(yard["speedup"]))  # an older file: its one ratio
    median = float(yard["speedup"]) if _is_number(yard.get("speedup")) else None
    ratios = sorted(r for _, _, r in pairs if r is not None)
    if median is None and ratios:
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    if not pairs and median is None:
        return None
    return {"pairs": pairs, "median": median}


def _ratio(v: float | None, bold: bool = False) -> str:
    """``1.027×``: three decimals, as overlap's effects are often a few per cent (``—`` for None)."""
    if v is None:
        return "—"
    return f"**{v:.3f}×**" if bold else f"{v:.3f}×"


def overlap_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the ratios, the timeline with its caption and per-run means, the
    batch-size-1 decode table and the yardstick's repeats; None when the file has none of them."""
    data = res.data
    timeline, decode, yard = _overlap_timeline(data), _overlap_decode(data), _overlap_yardstick(data)
    if timeline is None and decode is None and yard is None:
        return None
    out = _overlap_headline(data)
    if timeline is not None:
        out += _plot_markdown(res, "Timeline of traced decode steps with overlap scheduling off and on: host and device lanes")
        out += _timeline_caption(timeline) + _timeline_table(timeline)
    if decode is not None:
        out += ["", "**Decode at batch size 1**, ms per output token:", ""] + _decode_table(data, decode)
    if yard is not None:
        out += ["", "**Offline yardstick**, output tokens per second with overlap off and on:", ""]
        out += _yardstick_table(yard)
    results = data["results"]
    shown = {"timeline", "copy_bandwidth_bytes_s"}
    shown |= {"decode"} if decode is not None else set()
    shown |= {"yardstick"} if yard is not None else set()
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _timeline_caption(timeline: dict[str, list]) -> list[str]:
    periods = [f"{label} **{_number(_step_period(timeline[key]), 'ms')}** per step" for key, label in OVERLAP_RUNS]
    device = any("device" in step for steps in timeline.values() for step in steps)
    return [
        "Each bar is one part of one traced decode step, every other step in a lighter shade; "
        + ("the device lane is the GPU's work for the step. " if device else "no device lane: the run traced none (CPU). ")
        + "Measured " + ", ".join(periods) + " (one step's start to the next, averaged). "
        "Spans too short to see are drawn as thin ticks.",
        "",
    ]


def _timeline_table(timeline: dict[str, list]) -> list[str]:
    device = any("device" in step for steps in timeline.values() for step in steps)
    head = "| | traced steps | ms per step | last process end / steps | schedule | launch | process |"
    align = "|---|---:|---:|---:|---:|---:|---:|"
    if device:
        head += " device busy | device idle between steps |"
        align += "---:|---:|"
    out = [head, align]
    for key, label in OVERLAP_RUNS:
        steps = timeline[key]
        stats = _timeline_stats(steps)
        cells = [label, str(len(steps)), f"**{_number(_step_period(steps), 'ms')}**",
                 _number(_timeline_end_per_step(steps), "ms")]
        keys = ["schedule", "launch", "process"] + (["device", "device_gap"] if device else [])
        cells += [_number(stats[k], "ms") if stats[k] is not None else "—" for k in keys]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "The lane columns are each part's mean length per step."]


def _decode_table(data: dict, decode: dict[str, dict], runs: tuple = OVERLAP_RUNS, feature: str = "overlap") -> list[str]:
    """One row per shape: ms per token off and on (``runs``), the speed-up with ``feature``, the
    bytes read per step and the roofline."""
    (off, off_label), (on, on_label) = runs
    out = [
        f"| shape | {off_label} | {on_label} | speed-up with {feature} | bytes read per step | roofline "
        "| share of the roofline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for shape, run in decode.items():
        fraction = _decode_fraction(run, runs)
        cells = [
            _md_cell(str(shape)),
            _number(run[off], "ms"),
            _number(run[on], "ms"),
            _ratio(_decode_speedup(run, runs), bold=True),
            _bytes(run["bytes_per_step"]) if _is_number(run.get("bytes_per_step")) else "—",
            _number(run["roofline_ms"], "ms") if _is_number(run.get("roofline_ms")) else "—",
            f"{fraction:.1%}" if fraction is not None else "—",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + _roofline_note(data, "bytes read per step", on_label)


def _roofline_note(data: dict, what: str, on_label: str) -> list[str]:
    """The note under a decode table: the roofline is ``what`` over the copy bandwidth of the
    run, its share taken with ``on_label``; or that the run measured no bandwidth."""
    bandwidth = data["results"].get("copy_bandwidth_bytes_s")
    if _is_number(bandwidth) and bandwidth > 0:
        return ["", f"Roofline: {what} over the device copy bandwidth measured in the same run "
                f"({_number(bandwidth / 1e12, 'TB/s')}); the share is the roofline over the time with {on_label}."]
    return ["", "No roofline: the run measured no device copy bandwidth."]


def _yardstick_table(yard: dict[str, Any], runs: tuple = OVERLAP_RUNS, names: tuple[str, str] = ("off", "on")) -> list[str]:
    """One row per repeat (each setting's tok/s and their ratio), the median, and the runs folded
    away (``names``: the two settings' short names in the header)."""
    pairs, median = yard["pairs"], yard["median"]
    (_, off_label), (_, on_label) = runs
    off_name, on_name = names
    out = [f"| repeat | {off_label} | {on_label} | {on_name} / {off_name} | KV pages ({off_name}, {on_name}) |",
           "|---|---:|---:|---:|---:|"]

    def tok_s(run: dict) -> str:
        return _number(run["output_tok_s"], "tok/s") if _is_number(run.get("output_tok_s")) else "—"

    for i, (off, on, ratio) in enumerate(pairs, 1):
        pages = ", ".join(_fmt(run["kv_pages"]) if _is_number(run.get("kv_pages")) else "—" for run in (off, on))
        out.append(f"| {i} | {tok_s(off)} | {tok_s(on)} | {_ratio(ratio, bold=len(pairs) == 1)} | {pages} |")
    if median is not None and len(pairs) != 1:  # one run (an older file): its ratio is the result
        out.append(f"| median | | | {_ratio(median, bold=True)} | |")
    rows = [{"setting": label, "repeat": i, **pair[side]}
            for side, (_, label) in enumerate(runs) for i, pair in enumerate(pairs, 1)]
    if rows:
        out += ["", '??? note "Offline yardstick runs"', ""] + _indent(_rows_table(rows)) + [""]
    return out


def _decode_workload(config: dict[str, Any]) -> str | None:
    """``batch-size-1 decode: 256 tokens after a 128-token prompt``, from a config."""
    if _is_number(config.get("decode_prompt_len")) and _is_number(config.get("decode_tokens")):
        return f"batch-size-1 decode: {config['decode_tokens']:,} tokens after a {config['decode_prompt_len']:,}-token prompt"
    return None


def _yardstick_workload(config: dict[str, Any]) -> str | None:
    """``offline yardstick: 256 requests, input and output lengths 100–1,024 tokens (qwen3-0.6b)``."""
    yard = []
    if _is_number(config.get("yardstick_requests")):
        yard.append(f"{config['yardstick_requests']:,} requests,")
    lens = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", str(config.get("yardstick_len", "")))
    if lens:
        yard.append(f"input and output lengths {int(lens.group(1)):,}–{int(lens.group(2)):,} tokens")
    if config.get("yardstick_shape"):
        yard.append(f"({_md_cell(str(config['yardstick_shape']))})")
    return "offline yardstick: " + " ".join(yard) if yard else None


def _on_off_ratios(decode: dict[str, dict] | None, yardstick: dict[str, Any] | None, runs: tuple) -> list[str]:
    """The on/off ratios of a headline: batch-size-1 decode per shape, the yardstick's median."""
    line = []
    if decode is not None:
        speedups = [(shape, _decode_speedup(run, runs)) for shape, run in decode.items()]
        line.append("batch-size-1 decode " + ", ".join(
            f"{_ratio(s, bold=True)} ({_md_cell(str(shape))})" for shape, s in speedups if s is not None))
    if yardstick is not None and yardstick["median"] is not None:
        n = len(yardstick["pairs"])
        line.append(f"offline yardstick {_ratio(yardstick['median'], bold=True)}"
                    + (f" (median of {n} repeats)" if n > 1 else " (one run)" if n == 1 else ""))
    return line


def _overlap_headline(data: dict) -> list[str]:
    """The workloads on one line; on the next, overlap on against off in each measurement."""
    config = _config(data)
    parts = _setup_parts(config)
    if _overlap_timeline(data) is not None:
        parts.append("timeline: " + _timeline_workload(data))
    parts += [w for w in (_decode_workload(config), _yardstick_workload(config)) if w]
    out = [" · ".join(parts), ""] if parts else []

    line = []
    timeline = _overlap_timeline(data)
    if timeline is not None:
        off, on = (_step_period(timeline[key]) for key, _ in OVERLAP_RUNS)
        line.append(f"timeline {_number(off)} → {_number(on, 'ms')} per step")
    line += _on_off_ratios(_overlap_decode(data), _overlap_yardstick(data), OVERLAP_RUNS)
    return out + (["Overlap on against off: " + "; ".join(line) + ".", ""] if line else [])
