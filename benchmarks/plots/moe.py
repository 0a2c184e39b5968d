"""``moe`` results (lesson 11's mixture-of-experts layer on the Qwen3-30B-A3B shape): the MoE
layer alone per batch size, the fused path against the one-expert-at-a-time reference and its
bytes bound, batch-size-1 decode of the whole model against its roofline, and (``--parallel N``)
one GPU against TP=N against EP=N on the whole model.

:func:`draw_moe` draws the chart (a matplotlib figure), :func:`moe_section` writes the
Benchmarks page section (Markdown). Lesson 11's two targets are judged from the file's numbers:
the fused layer at batch size 1 at :data:`LAYER_TARGET` of its bytes bound or more, and bs=1
decode within :data:`DECODE_TARGET` times its roofline. A file with layer rows is drawn as the
layer chart; a file with only the parallel comparison as bars of each side's bs=1 decode (its
all-reduces shaded) and yardstick throughput."""

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


def _side_label(key: str, entry: dict[str, Any]) -> str:
    """``one GPU``, ``TP=2`` or ``EP=2``: a parallel side by its settings (EP over TP)."""
    settings = entry.get("settings") if isinstance(entry.get("settings"), dict) else {}
    ep, tp = settings.get("ep_size"), settings.get("tp_size")
    if _is_number(ep) and ep > 1:
        return f"EP={ep}"
    if _is_number(tp) and tp > 1:
        return f"TP={tp}"
    return "one GPU" if key == "one_gpu" or not settings else _md_cell(key)


def _parallel(data: dict) -> dict[str, Any] | None:
    """``results.parallel`` (``--parallel N``): its sides with a positive ``decode_bs1_ms``, in
    the file's order, each with its ``label``, ``ms``, ``runs``, yardstick ``tok_s`` and, for a
    side other than ``one_gpu``, against it: ``speedup`` (bs=1 decode), ``yardstick_ratio`` and
    ``share`` (the all-reduces' share of its bs=1 step), the file's, else computed, and
    ``reduce_ms`` (that share of its step); with ``per_step`` all-reduces of ``us`` µs each and
    the measured all-reduce ``rows``. None without such sides."""
    results = data.get("results")
    part = results.get("parallel") if isinstance(results, dict) else None
    sides = part.get("sides") if isinstance(part, dict) else None
    if not isinstance(sides, dict):
        return None
    per_step, us = part.get("all_reduces_per_step"), part.get("all_reduce_us_in_graph")
    reduce_ms = per_step * us / 1e3 if _positive(per_step) and _positive(us) else None

    def tok_s(entry: Any) -> float | None:
        yard = entry.get("yardstick") if isinstance(entry, dict) else None
        value = yard.get("output_tok_s") if isinstance(yard, dict) else None
        return float(value) if _positive(value) else None

    base = sides.get("one_gpu")
    base_ms = base["decode_bs1_ms"] if isinstance(base, dict) and _positive(base.get("decode_bs1_ms")) else None
    base_tok_s = tok_s(base)
    out = []
    for key, entry in sides.items():
        if not isinstance(entry, dict) or not _positive(entry.get("decode_bs1_ms")):
            continue
        ms, other = float(entry["decode_bs1_ms"]), key != "one_gpu"
        runs = entry.get("decode_runs_ms")
        speedup, ratio, share = (entry.get(k) for k in ("speedup_bs1_vs_one_gpu", "yardstick_vs_one_gpu",
                                                         "all_reduce_share_bs1"))
        if not _positive(speedup):
            speedup = base_ms / ms if other and base_ms else None
        if not _positive(ratio):
            ratio = tok_s(entry) / base_tok_s if other and base_tok_s and tok_s(entry) else None
        if not _positive(share):
            share = reduce_ms / ms if other and reduce_ms else None
        out.append({"key": key, "label": _side_label(key, entry), "entry": entry, "ms": ms,
                    "runs": runs if isinstance(runs, list) and runs and all(_positive(r) for r in runs) else None,
                    "tok_s": tok_s(entry), "speedup": speedup, "yardstick_ratio": ratio, "share": share,
                    "reduce_ms": share * ms if share else None})
    if not out:
        return None
    rows = part.get("all_reduce")
    return {"sides": out, "per_step": per_step if _positive(per_step) else None, "us": us if _positive(us) else None,
            "rows": rows if isinstance(rows, list) else None}


def _side_colors(sides: list[dict[str, Any]], theme: dict[str, Any]) -> list[str]:
    """One GPU grey, the other sides the theme's series in turn."""
    colors, i = [], 0
    for side in sides:
        if side["key"] == "one_gpu":
            colors.append(theme["other"])
        else:
            colors.append(theme["series"][i % len(theme["series"])])
            i += 1
    return colors


def _draw_parallel(data: dict, parallel: dict[str, Any], theme: dict[str, Any]):
    """Bars per side (one GPU, TP=N, EP=N): bs=1 decode ms per token with its runs' min–max and
    the all-reduces' part of the step shaded (left); the yardstick's output tok/s (right, when
    measured). Each bar labelled with its value and its ratio to one GPU."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import StrMethodFormatter

    sides = parallel["sides"]
    yardstick = [s for s in sides if s["tok_s"] is not None]
    fig = Figure(figsize=(PLOT_WIDTH_IN, 3.7), layout="constrained")
    axes = fig.subplots(1, 2 if yardstick else 1, squeeze=False)[0]
    colors = _side_colors(sides, theme)
    x = list(range(len(sides)))

    ms_ax = axes[0]
    ms = [s["ms"] for s in sides]
    low = [s["ms"] - min(s["runs"]) if s["runs"] else 0.0 for s in sides]
    high = [max(s["runs"]) - s["ms"] if s["runs"] else 0.0 for s in sides]
    ms_ax.bar(x, ms, width=0.55, color=colors, yerr=[low, high], capsize=4,
              error_kw={"ecolor": theme["fg"], "elinewidth": 1.0})
    shaded = [(xi, s["reduce_ms"]) for xi, s in zip(x, sides) if s["reduce_ms"]]
    if shaded:
        ms_ax.bar([xi for xi, _ in shaded], [v for _, v in shaded], width=0.55, color="none", hatch="///",
                  edgecolor=theme["fg"], linewidth=0)
    for xi, s in zip(x, sides):
        text = _number(s["ms"], "ms") + (f"\n{_faster(s['speedup'])}" if s["speedup"] else "")
        ms_ax.annotate(text, (xi, s["ms"] + high[xi]), xytext=(0, 3), textcoords="offset points", ha="center",
                       fontsize=8.5, fontweight="bold")
    ms_ax.set_ylim(0, max(m + h for m, h in zip(ms, high)) * 1.3)
    runs = max((len(s["runs"]) for s in sides if s["runs"]), default=0)
    ms_ax.set_ylabel("ms per token, lower is better" + (f"\n(median of {runs} runs, min–max)" if runs > 1 else ""))
    ms_ax.set_title("Decode at batch size 1", loc="left")

    if yardstick:
        tok_ax = axes[1]
        values = [s["tok_s"] or 0.0 for s in sides]
        tok_ax.bar(x, values, width=0.55, color=colors)
        for xi, s in zip(x, sides):
            if s["tok_s"] is None:
                continue
            text = _number(s["tok_s"], "tok/s") + (f"\n{_faster(s['yardstick_ratio'])}" if s["yardstick_ratio"] else "")
            tok_ax.annotate(text, (xi, s["tok_s"]), xytext=(0, 3), textcoords="offset points", ha="center",
                            fontsize=8.5, fontweight="bold")
        tok_ax.set_ylim(0, max(values) * 1.3)
        tok_ax.set_ylabel("output tok/s, higher is better")
        tok_ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        requests = next((s["entry"]["yardstick"].get("requests") for s in yardstick
                         if _is_number(s["entry"]["yardstick"].get("requests"))), None)
        tok_ax.set_title("Offline yardstick" + (f" ({requests} requests)" if requests else ""), loc="left")
    for ax in axes:
        ax.set_xticks(x, [s["label"] for s in sides])
        ax.set_xlim(-0.6, len(sides) - 0.4)
        ax.grid(axis="x", visible=False)
    if shaded:
        count = f"{_fmt(parallel['per_step'])} × {_number(parallel['us'], 'µs')}" if parallel["per_step"] and \
            parallel["us"] else ""
        label = "the all-reduces of a step" + (f" ({count}, in a CUDA graph)" if count else "")
        fig.legend(handles=[Patch(facecolor="none", edgecolor=theme["fg"], hatch="///", linewidth=0, label=label)],
                   loc="outside lower center")
    shape = _config(data).get("shape")
    names = " against ".join(s["label"] for s in sides)
    fig.suptitle(f"{names[:1].upper() + names[1:]}{f' ({shape})' if shape else ''}{_on_hardware(data)}",
                 x=0.01, ha="left")
    return fig


def draw_moe(data: dict, theme: dict[str, Any]):
    """Two panels over the batch size (log scale): µs per layer call of the fused path, the
    reference loop and the fused path's bytes bound (left, log scale); the fused path's share of
    its bytes bound with the bs=1 target (right). A file without layer rows but with the parallel
    comparison: :func:`_draw_parallel`. None with neither."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator, PercentFormatter

    rows = _layer_rows(data)
    if rows is None:
        parallel = _parallel(data)
        return _draw_parallel(data, parallel, theme) if parallel is not None else None
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
    its roofline, one GPU against TP and EP (with ``--parallel``) and any other numbers; None when
    the file has no layer rows, no decode and no parallel comparison."""
    data = res.data
    rows, decode, parallel = _layer_rows(data), _decode(data), _parallel(data)
    if rows is None and decode is None and parallel is None:
        return None
    out = _moe_headline(data, layer=rows is not None)
    if rows is not None or decode is not None:
        out += [_targets(rows, decode), ""]
        if rows is not None:
            out += _plot_markdown(res, "µs per MoE layer call against batch size for the fused path, the reference "
                                       "loop and the bytes bound, and the fused path's share of its bytes bound")
            out += _layer_table(data, rows)
        out += ["", _decode_line(decode)]
    if parallel is not None:
        out += ([""] if rows is not None or decode is not None else []) + _parallel_part(res, parallel, rows is None)
    results = data["results"]
    shown = {"copy_bandwidth_bytes_s"} | ({"layer"} if rows is not None else set())
    shown |= {"decode_bs1"} if decode is not None else set()
    shown |= {"parallel"} if parallel is not None else set()
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _moe_headline(data: dict, layer: bool = True) -> list[str]:
    """``**qwen3-30b-a3b** · bfloat16 · routing … · 8 layers' weights cycled · copy bandwidth``
    (the weights cycled only with ``layer``: they are the layer sweep's)."""
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    model = config.get("model_config") if isinstance(config.get("model_config"), dict) else {}
    if all(_is_number(model.get(k)) for k in ("num_experts", "num_experts_per_tok", "num_hidden_layers")):
        parts.append(f"{model['num_experts']} experts, top-{model['num_experts_per_tok']}, "
                     f"{model['num_hidden_layers']} layers")
    parts += [_md_cell(str(config["dtype"]))] if config.get("dtype") else []
    parts += [f"routing: {_md_cell(str(config['routing']))}"] if config.get("routing") else []
    if layer and _is_number(config.get("copies")):
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


PARALLEL_COLUMNS = ("", "settings", "bs=1 decode (runs)", "bs=1, over one GPU", "all-reduces, share of a bs=1 step",
                    "yardstick", "yardstick, over one GPU")


def _parallel_part(res: BenchmarkResult, parallel: dict[str, Any], drawn: bool) -> list[str]:
    """What was run, where and at which commit; the plot (``drawn``: the file's chart is this
    one); a row per side; the all-reduces of a step and each measured all-reduce."""
    from .tp import _tp_all_reduce, _tp_all_reduce_table

    data, sides = res.data, parallel["sides"]
    config = _config(data)
    hw = data.get("hardware") if isinstance(data.get("hardware"), dict) else {}
    count = hw.get("gpu_count")
    where = (f"{count} × {hw['gpu']}" if _is_number(count) and count > 1 else str(hw["gpu"])) if hw.get("gpu") else ""
    commit = data.get("commit")
    yard = _yardstick_words(config, sides)
    names = " against ".join(s["label"] for s in sides)
    runs = max((len(s["runs"]) for s in sides if s["runs"]), default=0)
    text = (f"**{names[:1].upper() + names[1:]}** on the whole model"
            + (f", on {_md_cell(where)}" if where else "") + (f" at commit `{_md_cell(str(commit))}`" if commit else "")
            + f" ({_command(config, layer=not drawn)}): one engine after the other in one run, each measured by "
            + f"bs=1 decode in ms per token (CUDA graphs on{f'; the median of {runs} runs' if runs > 1 else ''})"
            + (f" and the offline yardstick ({yard})" if yard else "") + ".")
    out = [text, ""]
    if drawn:
        out += _plot_markdown(res, "bs=1 decode ms per token (the all-reduces' part shaded) and the yardstick's "
                                   "output tokens per second on one GPU, with tensor parallelism and with expert "
                                   "parallelism")
    out += ["| " + " | ".join(PARALLEL_COLUMNS) + " |", "|---|---|" + "---:|" * (len(PARALLEL_COLUMNS) - 2)]
    for s in sides:
        settings = s["entry"].get("settings")
        runs_text = f" ({', '.join(_number(r) for r in s['runs'])})" if s["runs"] and len(s["runs"]) > 1 else ""
        cells = [
            s["label"],
            ", ".join(f"`{_md_cell(f'{k}={v}')}`" for k, v in settings.items()) if isinstance(settings, dict) and settings
            else "—",
            _number(s["ms"], "ms") + runs_text,
            f"{_number(s['speedup'])}×" if s["speedup"] else "—",
            f"{_pct(s['share'])} ({_number(s['reduce_ms'], 'ms')})" if s["share"] else "—",
            _number(s["tok_s"], "tok/s") if s["tok_s"] else "—",
            f"**{_number(s['yardstick_ratio'])}×**" if s["yardstick_ratio"] else "—",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", _all_reduce_line(config, parallel)]
    measured = _tp_all_reduce({"config": config, "results": {"all_reduce": parallel["rows"]}})
    if measured is not None:
        out += ["", "One all-reduce of the message a bs=1 step sends, measured alone:", ""]
        out += _tp_all_reduce_table({"results": {}}, measured)
    return out


def _command(config: dict[str, Any], layer: bool) -> str:
    """The command line of a parallel run, as far as the config tells it."""
    gpus = config.get("parallel")
    flags = ("" if layer else " --skip-layer") + (" --decode" if config.get("decode") is True else "")
    return f"`python -m benchmarks moe{flags}" + (f" --parallel {gpus}`" if _is_number(gpus) else " --parallel N`")


def _yardstick_words(config: dict[str, Any], sides: list[dict[str, Any]]) -> str:
    """``128 requests, input and output lengths 100–1,024 tokens`` (from the config, else the
    requests of a side's yardstick), or "" when no side ran it."""
    if not any(s["tok_s"] for s in sides):
        return ""
    requests = config.get("yardstick_requests")
    if not _is_number(requests):
        requests = next((s["entry"]["yardstick"].get("requests") for s in sides if s["tok_s"]), None)
    parts = [f"{_fmt(requests)} requests"] if _is_number(requests) else []
    lens = str(config.get("yardstick_len", "")).split(",")
    if len(lens) == 2 and all(v.strip().isdigit() for v in lens):
        lo, hi = (int(v) for v in lens)
        parts.append(f"input and output lengths {lo:,}–{hi:,} tokens")
    return ", ".join(parts) or "the offline yardstick"


def _all_reduce_line(config: dict[str, Any], parallel: dict[str, Any]) -> str:
    """The all-reduces of a bs=1 step: how many, µs each, ms in all, and each side's share."""
    per_step, us = parallel["per_step"], parallel["us"]
    shares = [s for s in parallel["sides"] if s["share"]]
    if not (per_step and us):
        return "**All-reduces**: not counted in this run." if not shares else \
            "**All-reduces** of a bs=1 step: " + ", ".join(f"{_pct(s['share'])} of {s['label']}'s" for s in shares) + "."
    model = config.get("model_config") if isinstance(config.get("model_config"), dict) else {}
    layers = model.get("num_hidden_layers")
    why = f" (two per layer of {layers}, and one more)" if _is_number(layers) and per_step == 2 * layers + 1 else ""
    text = (f"**All-reduces** of a bs=1 step under TP and EP alike: {_fmt(per_step)}{why}, "
            f"{_number(us, 'µs')} each (the fastest in a CUDA graph, measured in the same run: below), "
            f"{_number(per_step * us / 1e3, 'ms')} in all")
    if shares:
        text += ": " + ", ".join(f"{_pct(s['share'])} of {s['label']}'s {_number(s['ms'], 'ms')} step" for s in shares)
    return text + ". The rest of a step is each GPU's own work."
