"""``moe`` results (lesson 11's mixture-of-experts layer on the Qwen3-30B-A3B shape): the MoE
layer alone per batch size, the fused path against the one-expert-at-a-time reference and its
bytes bound, and batch-size-1 decode of the whole model against its roofline.

:func:`draw_moe` draws the chart (a matplotlib figure), :func:`moe_section` writes the
Benchmarks page section (Markdown). Lesson 11's two targets are judged from the file's numbers:
the fused layer at batch size 1 at :data:`LAYER_TARGET` of its bytes bound or more, and bs=1
decode within :data:`DECODE_TARGET` times its roofline."""

from __future__ import annotations

import statistics
from typing import Any

from .common import (
    MARKERS,
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
    _short_count,
)

LAYER_TARGET = 0.70  # the fused layer at bs=1: this share of its bytes bound, or more
DECODE_TARGET = 1.4  # bs=1 decode of the whole model: at most this many times its roofline
LESSON = "[lesson 11](../lessons/l11/README.md)"

_LAYER_NUMBERS = ("batch_size", "fused_us", "reference_us", "bytes_bound_us")


def _positive(v: Any) -> bool:
    return _is_number(v) and v > 0


def _layer_rows(data: dict) -> list[dict[str, Any]] | None:
    """``results.layer``, the rows with a positive batch size and fused, reference and bound µs,
    by batch size, each with ``fraction`` (the bytes bound over the fused µs) and ``speedup``
    (the reference's µs over the fused ones): the file's, else computed. None without such rows."""
    results = data.get("results")
    layer = results.get("layer") if isinstance(results, dict) else None
    if not isinstance(layer, list):
        return None
    rows = []
    for row in layer:
        if not isinstance(row, dict) or not all(_positive(row.get(k)) for k in _LAYER_NUMBERS):
            continue
        fraction = row.get("fraction_of_bytes_bound")
        speedup = row.get("fused_speedup_vs_reference")
        rows.append({
            **row,
            "fraction": float(fraction) if _is_number(fraction) else row["bytes_bound_us"] / row["fused_us"],
            "speedup": float(speedup) if _is_number(speedup) else row["reference_us"] / row["fused_us"],
        })
    return sorted(rows, key=lambda r: r["batch_size"]) or None


def _decode(data: dict) -> dict[str, Any] | None:
    """``results.decode_bs1`` with a positive ``ms_per_token``, and ``times`` (its ms over the
    roofline's: the file's ``times_roofline``, else computed; None without a roofline)."""
    results = data.get("results")
    run = results.get("decode_bs1") if isinstance(results, dict) else None
    if not isinstance(run, dict) or not _positive(run.get("ms_per_token")):
        return None
    times = run.get("times_roofline")
    if not _is_number(times):
        times = run["ms_per_token"] / run["roofline_ms"] if _positive(run.get("roofline_ms")) else None
    return {**run, "times": times}


def _bandwidth(data: dict) -> float | None:
    value = data["results"].get("copy_bandwidth_bytes_s")
    return float(value) if _positive(value) else None


def _bs1(rows: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return next((r for r in rows or [] if r["batch_size"] == 1), None)


def _pct(fraction: float) -> str:
    return f"{fraction:.0%}"


def _bytes(nbytes: float) -> str:
    """``75.5 MB``, ``1,210 MB``, ``6.1 GB``: decimal units, as the benchmark prints them."""
    return _number(nbytes / 1e9, "GB") if nbytes >= 5e9 else _number(nbytes / 1e6, "MB")


def draw_moe(data: dict, theme: dict[str, Any]):
    """Two panels over the batch size (log scale): µs per layer call of the fused path, the
    reference loop and the fused path's bytes bound (left, log scale); the fused path's share of
    its bytes bound with the bs=1 target (right). None without layer rows."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator, PercentFormatter

    rows = _layer_rows(data)
    if rows is None:
        return None
    bs = [r["batch_size"] for r in rows]
    fused, reference, bound = ([r[k] for r in rows] for k in ("fused_us", "reference_us", "bytes_bound_us"))
    fraction = [r["fraction"] for r in rows]
    series = theme["series"]

    fig = Figure(figsize=(PLOT_WIDTH_IN, 4.3), layout="constrained")
    times_ax, share_ax = fig.subplots(1, 2, sharex=True, gridspec_kw={"width_ratios": [1.15, 1]})
    lines = [
        ("fused (in a CUDA graph)", fused, theme["accent"], MARKERS[0], "-"),
        ("reference loop (eager)", reference, series[1], MARKERS[1], "-"),
        ("bytes bound of the fused path", bound, theme["fg"], None, "--"),
    ]
    for label, values, color, marker, style in lines:
        times_ax.plot(bs, values, color=color, marker=marker, markersize=4.5, linewidth=1.8 if marker else 1.2,
                      linestyle=style, label=label)
    times_ax.set_yscale("log")
    times_ax.set_ylabel("µs per layer call (log scale, lower is better)")
    times_ax.set_title("The MoE layer alone", loc="left")
    first = rows[0]  # the smallest batch: the fused path's speed-up under the reference's point
    times_ax.annotate(f"fused: {_faster(first['speedup'])}", (first["batch_size"], first["reference_us"]),
                      xytext=(6, -14), textcoords="offset points", fontsize=8.5, color=theme["accent"])

    share_ax.plot(bs, fraction, color=theme["accent"], marker=MARKERS[0], markersize=4.5, linewidth=1.8)
    share_ax.axhline(LAYER_TARGET, color=theme["fg"], linestyle=":", linewidth=1.2)
    share_ax.annotate(f"target at batch size 1: {_pct(LAYER_TARGET)}", (1.0, LAYER_TARGET),
                      xycoords=("axes fraction", "data"), xytext=(-3, -11), textcoords="offset points",
                      ha="right", fontsize=8.5, color=theme["muted"])
    share_ax.axhline(1.0, color=theme["other"], linestyle="--", linewidth=1.0)
    share_ax.annotate("the bytes bound", (0.0, 1.0), xycoords=("axes fraction", "data"), xytext=(4, -11),
                      textcoords="offset points", fontsize=8.5, color=theme["muted"])
    bs1 = _bs1(rows)
    if bs1 is not None:
        share_ax.annotate(_pct(bs1["fraction"]), (1, bs1["fraction"]), xytext=(5, -13), textcoords="offset points",
                          fontsize=8.5, fontweight="bold")
    share_ax.set_ylim(0, max([1.05] + [f * 1.08 for f in fraction]))
    share_ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    share_ax.set_ylabel("share of the bytes bound (higher is better)")
    share_ax.set_title("The fused path against its bytes bound", loc="left")

    for ax in (times_ax, share_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [_short_count(int(b)) for b in bs])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelsize=9)
        ax.set_xlabel("batch size (tokens per layer call, log scale)")
    handles = [Line2D([], [], color=c, marker=m, markersize=4.5, linewidth=1.8 if m else 1.2, linestyle=s, label=label)
               for label, _, c, m, s in lines]
    fig.legend(handles=handles, loc="outside lower center", ncols=3)
    shape = _config(data).get("shape")
    fig.suptitle(f"Mixture-of-experts layer{f' ({shape})' if shape else ''}{_on_hardware(data)}", x=0.01, ha="left")
    return fig


def moe_section(res: BenchmarkResult) -> list[str] | None:
    """The workload, the two targets judged, the plot, a row per batch size, bs=1 decode against
    its roofline and any other numbers; None when the file has neither layer rows nor decode."""
    data = res.data
    rows, decode = _layer_rows(data), _decode(data)
    if rows is None and decode is None:
        return None
    out = _moe_headline(data)
    out += [_targets(rows, decode), ""]
    if rows is not None:
        out += _plot_markdown(res, "µs per MoE layer call against batch size for the fused path, the reference "
                                   "loop and the bytes bound, and the fused path's share of its bytes bound")
        out += _layer_table(data, rows)
    out += ["", _decode_line(decode)]
    results = data["results"]
    shown = {"copy_bandwidth_bytes_s"} | ({"layer"} if rows is not None else set())
    shown |= {"decode_bs1"} if decode is not None else set()
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _moe_headline(data: dict) -> list[str]:
    """``**qwen3-30b-a3b** · bfloat16 · routing … · 8 layers' weights cycled · copy bandwidth``."""
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    model = config.get("model_config") if isinstance(config.get("model_config"), dict) else {}
    if all(_is_number(model.get(k)) for k in ("num_experts", "num_experts_per_tok", "num_hidden_layers")):
        parts.append(f"{model['num_experts']} experts, top-{model['num_experts_per_tok']}, "
                     f"{model['num_hidden_layers']} layers")
    parts += [_md_cell(str(config["dtype"]))] if config.get("dtype") else []
    parts += [f"routing: {_md_cell(str(config['routing']))}"] if config.get("routing") else []
    if _is_number(config.get("copies")):
        parts.append(f"{config['copies']} layers' weights cycled per graph (none from the L2 cache)")
    bandwidth = _bandwidth(data)
    if bandwidth:
        parts.append(f"copy bandwidth {_number(bandwidth / 1e12, 'TB/s')}")
    return [" · ".join(parts), ""] if parts else []


def _targets(rows: list[dict[str, Any]] | None, decode: dict[str, Any] | None) -> str:
    """Lesson 11's two targets, each reached or not as the file's numbers say."""
    bs1 = _bs1(rows)
    if bs1 is None:
        layer = f"the fused layer at batch size 1 at {_pct(LAYER_TARGET)} of its bytes bound or more: not judged " \
                "(no batch-size-1 row)"
    else:
        reached = bs1["fraction"] >= LAYER_TARGET
        layer = (f"the fused layer at batch size 1 at {_pct(LAYER_TARGET)} of its bytes bound or more: "
                 f"**{_pct(bs1['fraction'])}, {'reached' if reached else 'not reached'}**")
    if decode is None or decode["times"] is None:
        why = "no bs=1 decode in this run" if decode is None else "no roofline in the file"
        whole = f"bs=1 decode within {_number(DECODE_TARGET)}× its roofline: not judged ({why})"
    else:
        reached = decode["times"] <= DECODE_TARGET
        whole = (f"bs=1 decode within {_number(DECODE_TARGET)}× its roofline: "
                 f"**{_number(decode['times'])}×, {'reached' if reached else 'not reached'}**")
    return f"Targets of {LESSON}: {layer}; {whole}."


LAYER_COLUMNS = ("batch size", "experts touched", "bytes", "fused", "reference", "fused speed-up", "bytes bound",
                 "fused, share of the bound")


def _layer_table(data: dict, rows: list[dict[str, Any]]) -> list[str]:
    out = ["**The MoE layer alone**, µs per call (the fused path inside a CUDA graph, the reference loop "
           "eagerly: it syncs with the host):", "",
           "| " + " | ".join(LAYER_COLUMNS) + " |", "|" + "---:|" * len(LAYER_COLUMNS)]
    for r in rows:
        touched, nbytes = r.get("experts_touched"), r.get("bytes")
        cells = [
            _fmt(r["batch_size"]),
            _fmt(touched) if _is_number(touched) else "—",
            _bytes(nbytes) if _is_number(nbytes) else "—",
            _number(r["fused_us"], "µs"),
            _number(r["reference_us"], "µs"),
            f"{_number(r['speedup'])}×",
            _number(r["bytes_bound_us"], "µs"),
            _pct(r["fraction"]),
        ]
        if r["batch_size"] == 1:
            cells[-1] = f"**{cells[-1]}**"
        out.append("| " + " | ".join(cells) + " |")
    bandwidth = _bandwidth(data)
    over = f"the copy bandwidth measured in the same run ({_number(bandwidth / 1e12, 'TB/s')})" if bandwidth \
        else "the copy bandwidth"
    return out + ["", "Bytes: the weights of the experts the batch touches (random routing), the input and the "
                  f"output; the bytes bound is those bytes over {over}, and the share is the bound over the fused "
                  "path's time."]


def _decode_line(decode: dict[str, Any] | None) -> str:
    if decode is None:
        return "**Decode at batch size 1**: not in this run (`python -m benchmarks moe --decode` measures it)."
    text = f"**Decode at batch size 1** of the whole model (random weights, CUDA graphs on): " \
           f"**{_number(decode['ms_per_token'], 'ms')} per token**"
    runs = decode.get("runs_ms")
    if isinstance(runs, list) and len(runs) > 1 and all(_is_number(r) for r in runs):
        median = statistics.median(runs) == decode["ms_per_token"]
        text += f" ({'median of ' if median else ''}{len(runs)} runs: {', '.join(_number(r) for r in runs)} ms)"
    if decode["times"] is not None and _positive(decode.get("roofline_ms")):
        text += f", {_number(decode['times'])}× its roofline of {_number(decode['roofline_ms'], 'ms')}"
        nbytes, weights = decode.get("bytes_per_step"), decode.get("weights_bytes")
        if _is_number(nbytes):
            read = f"{_bytes(nbytes)} read per step" + (f" of {_bytes(weights)} of weights" if _is_number(weights) else "")
            text += f" ({read}, over the copy bandwidth)"
    elif decode["times"] is not None:
        text += f", {_number(decode['times'])}× its roofline"
    else:
        text += "; no roofline in the file"
    replays = decode.get("graph_replays")
    return text + "." + (f" CUDA graph replays: {_fmt(replays)}." if _is_number(replays) else "")
