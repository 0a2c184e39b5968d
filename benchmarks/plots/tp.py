"""``tp`` results (tensor parallelism, lesson 9's feature), TP=2 against TP=1 in one run:
batch-size-1 decode against each one's roofline, the kernels of one decode step by kind, the
all-reduce TP adds, a trace of decode steps of a large batch, and the offline yardstick.

:func:`draw_tp` draws the chart (a matplotlib figure), :func:`tp_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

from typing import Any

from .common import (
    MARKERS,
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
from .graphs import (
    KERNELS_HEAD,
    Bar,
    _bar_panels_height,
    _binary_bytes,
    _decode_xlabel,
    _draw_bar_panels,
    _draw_graphs_kernels,
    _kernel_profile,
    _kernels_height,
    _kernels_table,
    _roofline_bar,
)
from .host import _stacked_figure
from .overlap import (
    _bytes,
    _decode_fraction,
    _decode_workload,
    _on_off_ratios,
    _paired_yardstick,
    _ratio,
    _roofline_note,
    _yardstick_table,
    _yardstick_workload,
)

# (results key, label) of a TP size's batch-size-1 decode runs; the NCCL run is TP>1's only.
TP_DECODE = (
    ("graphs_off", "graphs off (eager)"),
    ("graphs_on", "graphs on"),
    ("graphs_on_symmetric", "graphs on, all-reduce not fused with the norm"),
    ("graphs_on_nccl", "graphs on, NCCL all-reduce"),
)
# (key of an all-reduce row, label; ``{comm}``: the run's torch.distributed backend)
TP_ALL_REDUCE = (
    ("eager_us", "{comm}, eager"),
    ("graph_us", "{comm} in a CUDA graph"),
    ("symmetric_eager_us", "symmetric memory, eager"),
    ("symmetric_graph_us", "symmetric memory in a CUDA graph"),
)
TP_TRACE_PARTS = (("schedule_ms", "schedule"), ("launch_ms", "launch"), ("process_ms", "process"), ("device_ms", "device"))


def _tp_size(data: dict) -> int:
    """The TP size compared with TP=1: ``config.tp``, else 2."""
    tp = _config(data).get("tp")
    return int(tp) if _is_number(tp) and tp > 1 else 2


def _tp_runs(data: dict) -> tuple:
    """``(("tp1", "TP=1"), ("tp2", "TP=2"))``: the results keys and labels of the two TP sizes."""
    n = _tp_size(data)
    return (("tp1", "TP=1"), (f"tp{n}", f"TP={n}"))


def _tp_profiled(data: dict) -> list[tuple[str, str, str, str]]:
    """``(key, label, decode key, decode setting)`` of each profiled and traced engine: TP=1,
    TP=2, TP=2 with every all-reduce through NCCL (all with graphs on)."""
    (one, one_label), (two, two_label) = _tp_runs(data)
    return [(one, one_label, one, "graphs_on"), (two, two_label, two, "graphs_on"),
            (f"{two}_nccl", f"{two_label}, NCCL all-reduce", two, "graphs_on_nccl")]


def _tp_results(data: dict, key: str) -> Any:
    results = data.get("results")
    return results.get(key) if isinstance(results, dict) else None


def _tp_decode(data: dict) -> dict[str, dict] | None:
    """``results.decode``: the TP sizes (TP=1 first) with a numeric ms per token in a setting."""
    decode = _tp_results(data, "decode")
    if not isinstance(decode, dict):
        return None
    usable = {key: decode[key] for key, _ in _tp_runs(data)
              if isinstance(decode.get(key), dict) and any(_is_number(decode[key].get(s)) for s, _ in TP_DECODE)}
    return usable or None


def _tp_own_best(run: dict) -> str:
    """A TP size's fastest setting in the benchmark's eyes: graphs on, else graphs off (a CPU run)."""
    return "graphs_on" if _is_number(run.get("graphs_on")) else "graphs_off"


def _tp_fraction(run: dict) -> float | None:
    """The roofline over the ms per token of the run's graphs-on setting (graphs off on the CPU)."""
    best = _tp_own_best(run)
    return _decode_fraction(run, ((best, ""), (best, ""))) if _is_number(run.get(best)) else None


def _tp_speedup(data: dict, decode: dict[str, dict]) -> tuple[str, float] | None:
    """``(setting, TP=1's ms per token over TP=2's)``: graphs on where both have it, else graphs
    off; the file's ``decode_speedup``, else computed. None without both TP sizes."""
    (one, _), (two, _) = _tp_runs(data)
    if one not in decode or two not in decode:
        return None
    setting = next((s for s in ("graphs_on", "graphs_off")
                    if _is_number(decode[one].get(s)) and _is_number(decode[two].get(s))), None)
    if setting is None:
        return None
    given = _tp_results(data, "decode_speedup")
    if _is_number(given):
        return setting, float(given)
    return (setting, decode[one][setting] / decode[two][setting]) if decode[two][setting] else None


def _tp_kernels(data: dict) -> dict[str, list[tuple[str, str, dict[str, Any]]]] | None:
    """``{shape: [(key, label, profile)]}`` (as :func:`_graphs_kernels`) of one batch-size-1
    decode step of each profiled engine (:func:`_tp_profiled`), those the file has."""
    kernels = _tp_results(data, "kernels_per_decode_step")
    if not isinstance(kernels, dict):
        return None
    profiles = [(key, label, _kernel_profile(kernels.get(key))) for key, label, _, _ in _tp_profiled(data)]
    profiles = [p for p in profiles if p[2] is not None]
    shape = _config(data).get("shape")
    return {str(shape) if shape else "decode": profiles} if profiles else None


def _tp_all_reduce(data: dict) -> dict[str, Any] | None:
    """``{"rows": [...], "series": [(key, label)]}``: the all-reduce rows with a positive
    ``bytes`` and a timing, smallest first, and the timings any of them has."""
    rows = _tp_results(data, "all_reduce")
    if not isinstance(rows, list):
        return None
    rows = sorted((r for r in rows if isinstance(r, dict) and _is_number(r.get("bytes")) and r["bytes"] > 0
                   and any(_is_number(r.get(key)) for key, _ in TP_ALL_REDUCE)), key=lambda r: r["bytes"])
    comm = _config(data).get("comm_backend")
    comm = {"nccl": "NCCL"}.get(comm, comm) if isinstance(comm, str) and comm else "torch.distributed"
    series = [(key, label.format(comm=comm)) for key, label in TP_ALL_REDUCE if any(_is_number(r.get(key)) for r in rows)]
    return {"rows": rows, "series": series} if rows else None


def _tp_trace(data: dict) -> dict[str, Any] | None:
    """``{"batch": requests or None, "rows": [(key, label, summary)]}``: the traced engines
    whose ``decode_trace`` summary has a positive ``period_ms``."""
    trace = _tp_results(data, "decode_trace")
    if not isinstance(trace, dict):
        return None
    rows = []
    for key, label, _, _ in _tp_profiled(data):
        entry = trace.get(key)
        summary = entry.get("summary") if isinstance(entry, dict) else None
        if isinstance(summary, dict) and _is_number(summary.get("period_ms")) and summary["period_ms"] > 0:
            rows.append((key, label, summary))
    batch = trace.get("batch") if _is_number(trace.get("batch")) else None
    return {"batch": batch, "rows": rows} if rows else None


def _tp_yardstick(data: dict) -> dict[str, Any] | None:
    """The offline yardstick at TP=1 and TP=2 (see :func:`_paired_yardstick`)."""
    return _paired_yardstick(data, _tp_runs(data))


def _tp_decode_panels(data: dict, decode: dict[str, dict], theme: dict[str, Any]) -> list[tuple[str, list[Bar]]]:
    """A panel per TP size: ms per token in each setting (TP=2's compared one labelled with the
    speed-up over TP=1), and the roofline of one rank's bytes (labelled with the share of it
    that graphs on reach)."""
    colors = {"graphs_off": theme["other"], "graphs_on": theme["accent"], "graphs_on_symmetric": theme["series"][2],
              "graphs_on_nccl": theme["series"][1]}
    speedup = _tp_speedup(data, decode)
    (_, one_label), (two, _) = _tp_runs(data)
    panels = []
    for key, label in _tp_runs(data):
        if key not in decode:
            continue
        run, bars = decode[key], []
        for setting, setting_label in TP_DECODE:
            if _is_number(run.get(setting)):
                compared = speedup is not None and key == two and setting == speedup[0]
                text = _number(run[setting], "ms") + (f"   →  {_faster(speedup[1], one_label)}" if compared else "")
                bars.append((setting_label, float(run[setting]), colors[setting], text, compared))
        title = f"{label}: decode at batch size 1"
        if _is_number(run.get("bytes_per_rank_per_step")):
            title += f", {_bytes(run['bytes_per_rank_per_step'])} read per rank per step"
        panels.append((title, bars + _roofline_bar(run, _tp_fraction(run), theme, _tp_own_best(run).replace("_", " "))))
    return panels


def _draw_tp_all_reduce(fig, all_reduce: dict[str, Any], ranks: int, theme: dict[str, Any]) -> None:
    """µs per all-reduce against the message size (both on log scales), a line per way of
    calling it; each size's tick also names the batch size of the activation it carries."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    rows, series = all_reduce["rows"], all_reduce["series"]
    ax = fig.subplots()
    for i, (key, label) in enumerate(series):
        points = [(r["bytes"], r[key]) for r in rows if _is_number(r.get(key))]
        ax.plot(*zip(*points), color=theme["series"][i % len(theme["series"])], marker=MARKERS[i % len(MARKERS)],
                markersize=4.5, linewidth=1.8, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = {r["bytes"]: _binary_bytes(r["bytes"]) + (f"\nbs {_fmt(r['batch_size'])}" if _is_number(r.get("batch_size")) else "")
             for r in rows}
    ax.set_xticks(list(ticks), list(ticks.values()))
    ax.tick_params(axis="x", labelsize=8.5)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _number(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("message size: one [batch size, hidden] activation (log scale)")
    ax.set_ylabel("µs per all-reduce (log scale)")
    ax.set_title(f"All-reduce between the {ranks} ranks (lower is better)", loc="left")
    ax.legend(loc="upper left")


def draw_tp(data: dict, theme: dict[str, Any]):
    """Batch-size-1 decode per TP size against its roofline, the kernels of one decode step by
    kind, and the all-reduce's µs against the message size, stacked; those the file has."""
    decode, kernels, all_reduce = _tp_decode(data), _tp_kernels(data), _tp_all_reduce(data)
    if decode is None and kernels is None and all_reduce is None:
        return None
    parts = []
    if decode is not None:
        panels, xlabel = _tp_decode_panels(data, decode, theme), "bytes one rank reads per step"
        parts.append((_bar_panels_height(panels), lambda panel: _draw_bar_panels(panel, panels, _decode_xlabel(panels, xlabel))))
    if kernels is not None:
        parts.append((_kernels_height(kernels), lambda panel: _draw_graphs_kernels(panel, kernels, theme)))
    if all_reduce is not None:
        parts.append((3.6, lambda panel: _draw_tp_all_reduce(panel, all_reduce, _tp_size(data), theme)))
    (_, one), (_, two) = _tp_runs(data)
    return _stacked_figure(parts, f"Tensor parallelism, {two} against {one}{_on_hardware(data)}")


def tp_section(res: BenchmarkResult) -> list[str] | None:
    """The workloads and the ratios, the plot, then the tables: batch-size-1 decode, the kernels
    by kind, the all-reduce, the traced decode steps and the yardstick; None without any."""
    data = res.data
    decode, kernels, all_reduce = _tp_decode(data), _tp_kernels(data), _tp_all_reduce(data)
    trace, yard = _tp_trace(data), _tp_yardstick(data)
    if decode is None and kernels is None and all_reduce is None and trace is None and yard is None:
        return None
    runs = _tp_runs(data)
    (_, one), (_, two) = runs
    out = _tp_headline(data)
    if decode is not None or kernels is not None or all_reduce is not None:
        out += _plot_markdown(res, f"Batch-size-1 decode at {one} and {two} against each one's roofline, the kernels "
                              "of one decode step by kind, and all-reduce time against message size")
    if decode is not None:
        out += ["**Decode at batch size 1**, ms per output token:", ""] + _tp_decode_table(data, decode)
    if kernels is not None:
        profiled = {key: (decode_key, setting) for key, _, decode_key, setting in _tp_profiled(data)}

        def ms_per_token(_: str, key: str) -> Any:
            decode_key, setting = profiled[key]
            return (decode or {}).get(decode_key, {}).get(setting)

        out += ["", KERNELS_HEAD.format(settings=" (graphs on)"), ""] + _kernels_table(kernels, ms_per_token)
    if all_reduce is not None:
        out += ["", f"**All-reduce between the {_tp_size(data)} ranks**, µs per call:", ""]
        out += _tp_all_reduce_table(data, all_reduce)
    if trace is not None:
        batch = f" of {_fmt(trace['batch'])} requests" if trace["batch"] else ""
        out += ["", f"**Decode steps{batch}**, traced, mean ms per step:", ""] + _tp_trace_table(trace)
    if yard is not None:
        out += ["", f"**Offline yardstick**, output tokens per second at {one} and {two}:", ""]
        out += _yardstick_table(yard, runs, (one, two))
    shown = {"copy_bandwidth_bytes_s"}
    shown |= {"decode", "decode_speedup"} if decode is not None else set()
    shown |= {"kernels_per_decode_step"} if kernels is not None else set()
    shown |= {"all_reduce", "collectives_per_decode_step"} if all_reduce is not None else set()
    shown |= {"decode_trace"} if trace is not None else set()
    shown |= {"yardstick"} if yard is not None else set()
    rest = {k: v for k, v in data["results"].items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _tp_decode_table(data: dict, decode: dict[str, dict]) -> list[str]:
    """A row per TP size: ms per token in each setting the file has, the bytes one rank reads
    per step and the roofline; then TP=2's speed-up over TP=1 in each setting."""
    settings = [(s, label) for s, label in TP_DECODE if any(_is_number(run.get(s)) for run in decode.values())]
    out = ["| | " + " | ".join(label for _, label in settings) + " | bytes read per rank per step | roofline"
           " | share of the roofline |", "|---|" + "---:|" * (len(settings) + 3)]
    for key, label in _tp_runs(data):
        if key in decode:
            run, fraction = decode[key], _tp_fraction(decode[key])
            cells = [_number(run[s], "ms") if _is_number(run.get(s)) else "—" for s, _ in settings] + [
                _bytes(run["bytes_per_rank_per_step"]) if _is_number(run.get("bytes_per_rank_per_step")) else "—",
                _number(run["roofline_ms"], "ms") if _is_number(run.get("roofline_ms")) else "—",
                f"{fraction:.1%}" if fraction is not None else "—"]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    speedup = _tp_speedup(data, decode)
    if speedup is not None:
        (one, one_label), (two, two_label) = _tp_runs(data)
        cells = []
        for s, _ in settings:
            a, b = decode[one].get(s), decode[two].get(s)
            ratio = speedup[1] if s == speedup[0] else a / b if _is_number(a) and _is_number(b) and b else None
            cells.append(_ratio(ratio, bold=s == speedup[0]))
        out.append(f"| {two_label} speed-up over {one_label} | " + " | ".join(cells) + " | | | |")
    reach = "graphs on" if any(_is_number(run.get("graphs_on")) for run in decode.values()) else "graphs off"
    out += _roofline_note(data, "the bytes one rank reads per step (its share of the weights and of the KV)", reach)
    if any(_is_number(run.get("graphs_on_nccl")) for run in decode.values()):
        out += ["", "NCCL all-reduce: every all-reduce through `torch.distributed` (`tp_all_reduce=\"nccl\"`); "
                "in the other runs (`\"auto\"`), the small ones between GPUs go through symmetric memory."]
    if any(_is_number(run.get("graphs_on_symmetric")) for run in decode.values()):
        out += ["", "Not fused with the norm: symmetric memory's all-reduce, then the residual add and RMSNorm as a "
                "kernel of their own (`tp_all_reduce=\"symmetric\"`); `\"auto\"` does the three in one kernel."]
    return out


def _tp_all_reduce_table(data: dict, all_reduce: dict[str, Any]) -> list[str]:
    """A row per message size: each timing the file has, the fastest in bold; then what a
    decode step calls."""
    series = all_reduce["series"]
    out = ["| batch size | message | " + " | ".join(_md_cell(label) for _, label in series) + " |",
           "|---:|---:|" + "---:|" * len(series)]
    for r in all_reduce["rows"]:
        times = [r.get(key) if _is_number(r.get(key)) else None for key, _ in series]
        fastest = min(t for t in times if t is not None)
        cells = ["—" if t is None else f"**{_number(t, 'µs')}**" if t == fastest and len(series) > 1 else _number(t, "µs")
                 for t in times]
        batch = _fmt(r["batch_size"]) if _is_number(r.get("batch_size")) else "—"
        out.append(f"| {batch} | {_binary_bytes(r['bytes'])} | " + " | ".join(cells) + " |")
    graphs = any(key.endswith("graph_us") for key, _ in series)
    out += ["", "Rank 0's wall clock per call, over many calls in a row"
            + (" (in a CUDA graph: captured in one graph, replayed)." if graphs else ".")]
    collectives = _tp_results(data, "collectives_per_decode_step")
    if isinstance(collectives, dict) and collectives and all(_is_number(n) for n in collectives.values()):
        calls = " and ".join(f"{_fmt(n)} × {_md_cell(str(kind).replace('_', '-'))}" for kind, n in collectives.items())
        out[-1] += f" A decode step calls {calls}."
    return out


def _tp_trace_table(trace: dict[str, Any]) -> list[str]:
    """A row per traced engine: ms per step, output tokens per second and the ratio to TP=1's
    steps, then each part's mean ms per step."""
    rows, batch = trace["rows"], trace["batch"]
    parts = [(key, label) for key, label in TP_TRACE_PARTS if any(_is_number(s.get(key)) for _, _, s in rows)]
    base = rows[0][2]["period_ms"] if rows[0][0] == "tp1" else None
    out = ["| | ms per step | output tok/s | steps vs TP=1 | " + " | ".join(label for _, label in parts) + " |",
           "|---|" + "---:|" * (3 + len(parts))]
    for _, label, summary in rows:
        period = summary["period_ms"]
        cells = [f"**{_number(period, 'ms')}**", _number(batch * 1e3 / period) if batch else "—",
                 _ratio(base / period) if base else "—"]
        cells += [_number(summary[key], "ms") if _is_number(summary.get(key)) else "—" for key, _ in parts]
        out.append(f"| {_md_cell(label)} | " + " | ".join(cells) + " |")
    return out + ["", "ms per step: from one step's launch to the next, averaged; the parts: the host's schedule, "
                  "launch and process of a step, and the device's work for it (CUDA), each one's mean length."]


def _tp_headline(data: dict) -> list[str]:
    """The setup and the workloads on one line; on the next, TP=2 against TP=1 in each measurement."""
    config = _config(data)
    (_, one), (_, two) = runs = _tp_runs(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    parts += _setup_parts(config)
    comm = f" over {_md_cell(str(config['comm_backend']))}" if config.get("comm_backend") else ""
    parts.append(f"{two} against {one}{comm}")
    parts += [w for w in (_decode_workload(config), _yardstick_workload(config)) if w]
    out = [" · ".join(parts), ""]
    line = []
    decode = _tp_decode(data)
    speedup = _tp_speedup(data, decode) if decode is not None else None
    if speedup is not None:
        line.append(f"batch-size-1 decode {_ratio(speedup[1], bold=True)} ({speedup[0].replace('_', ' ')})")
    trace = _tp_trace(data)
    if trace is not None and len(trace["rows"]) >= 2 and trace["rows"][0][0] == runs[0][0] and trace["rows"][1][0] == runs[1][0]:
        one_ms, two_ms = trace["rows"][0][2]["period_ms"], trace["rows"][1][2]["period_ms"]
        batch = f" of {_fmt(trace['batch'])} requests" if trace["batch"] else ""
        line.append(f"decode steps{batch} {_ratio(one_ms / two_ms, bold=True)}")
    line += _on_off_ratios(None, _tp_yardstick(data), runs)
    return out + ([f"{two} against {one}: " + "; ".join(line) + ".", ""] if line else [])
