"""``moe`` results (lesson 11's mixture-of-experts layer on the Qwen3-30B-A3B shape): the MoE
layer alone per batch size, the fused path against the one-expert-at-a-time reference and its
bytes bound, batch-size-1 decode of the whole model against its roofline, and (``--parallel N``)
one GPU against TP=N against EP=N on the whole model. Newer files (``--gemv-tiles``) also hold the
layer's two forms side by side (grouped and matrix-vector, up to 16 tokens), the matrix-vector
form's tile sweep and chosen crossover, each form's kernels at batch size 1, and with
``--decode`` a bs=1 decode step's kernels by kind and the expert-load histogram of a workload.

:func:`draw_moe` draws the chart (a matplotlib figure), :func:`moe_section` writes the
Benchmarks page section (Markdown). Lesson 11's two targets are judged from the file's numbers:
the fused layer at batch size 1 at :data:`LAYER_TARGET` of its bytes bound or more, and bs=1
decode within :data:`DECODE_TARGET` times its roofline. A file with layer rows is drawn as the
layer chart (with both forms where the file has them), then, where the file has them, the two
forms at small batch sizes and kernel by kernel at batch size 1, the decode step's kernels by
kind and the expert load, stacked; a file with only the parallel comparison as bars of each
side's bs=1 decode (its all-reduces shaded) and yardstick throughput."""

from __future__ import annotations

import statistics
import textwrap
from typing import Any

from .common import (
    MARKERS,
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
    _short_count,
)
from .host import _stacked_figure

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


# The layer's two forms (``fused_moe(path=...)``): (row key, label), and each ``path`` value's key.
FORMS = (("grouped_us", "grouped"), ("gemv_us", "matrix-vector"))
FORM_OF_PATH = {"grouped": "grouped_us", "gemv": "gemv_us"}
FORM_LABELS = {"grouped": "grouped", "gemv": "matrix-vector"}  # ``results.kernels_bs1``'s keys
# The fused layer's kernels by their names in ``results.kernels_bs1`` (``_gate_up_gemv_kernel``
# and ``_gate_up_kernel`` alike), in the order they run; the matrix-vector form's down kernel
# sums the top-k itself (``_down_gemv_sum_kernel``; files before it have a separate sum).
KERNEL_LABELS = {"group": "grouping", "gate_up": "gate/up", "down": "down", "down_gemv_sum": "down + top-k sum",
                 "sum_top_k": "top-k sum"}


def _has_forms(rows: list[dict[str, Any]] | None) -> bool:
    """Whether layer rows time the two forms side by side (``grouped_us``, ``gemv_us``)."""
    return any(_positive(r.get(key)) for r in rows or [] for key, _ in FORMS)


def _runs_form(row: dict[str, Any]) -> str | None:
    """The key (``grouped_us`` or ``gemv_us``) of the form the layer runs at this row's batch size:
    the row's ``path``, else the form whose µs are its ``fused_us``; None when neither says."""
    key = FORM_OF_PATH.get(row.get("path"))
    if key and _positive(row.get(key)):
        return key
    return next((key for key, _ in FORMS if _positive(row.get(key)) and row[key] == row["fused_us"]), None)


def _form_label(key: str) -> str:
    return dict(FORMS).get(key, key)


def _gemv_choice(data: dict) -> dict[str, Any] | None:
    """``results.gemv_choice`` (``--gemv-tiles``): the matrix-vector form's tiles and
    ``gemv_max_tokens``, the most tokens it runs (0: never); None without that number."""
    choice = data["results"].get("gemv_choice") if isinstance(data.get("results"), dict) else None
    return choice if isinstance(choice, dict) and _is_number(choice.get("gemv_max_tokens")) else None


def _grouped_from(rows: list[dict[str, Any]] | None, limit: float) -> int | None:
    """The smallest batch size measured above ``limit`` tokens (where the grouped form takes over)."""
    return next((r["batch_size"] for r in rows or [] if r["batch_size"] > limit), None)


def _kernel_label(name: str) -> str:
    """``gate/up`` for ``_gate_up_gemv_kernel`` and ``_gate_up_kernel``; another name as it is."""
    stem = name.strip("_").removesuffix("_kernel").removesuffix("_gemv")
    return KERNEL_LABELS.get(stem, name)


LATENCY_KEYS = ("floor_one_number_kernel_us", "router_us", "router_with_pre_norm_us")


def _latency(data: dict) -> dict[str, float] | None:
    """``results.latency_bs1`` (``benchmarks moe --latency``) when its three times are positive
    numbers, else None."""
    results = data.get("results")
    latency = results.get("latency_bs1") if isinstance(results, dict) else None
    if not isinstance(latency, dict) or not all(_positive(latency.get(k)) for k in LATENCY_KEYS):
        return None
    return latency


def _latency_line(latency: dict[str, float]) -> str:
    """What a launch costs inside a graph at bs=1 against the router's time."""
    floor, router, normed = (latency[k] for k in LATENCY_KEYS)
    return (f"**Launch floor** (`--latency`, inside a CUDA graph at bs=1): a one-program kernel that moves one "
            f"number takes {_number(floor, 'µs')} a call; the decode router alone {_number(router, 'µs')} "
            f"({_number(router / floor)}× the floor), with its pre-norm step {_number(normed, 'µs')}: the rest is "
            "each kernel's own chain of dependent steps, not the launch.")


def _layer_kernels(data: dict) -> dict[str, dict[str, float]] | None:
    """``results.kernels_bs1``: per form, in the file's order, ``{kernel label: device µs per
    call}`` at batch size 1 (kernels with the same label added); None without a number."""
    results = data.get("results")
    kernels = results.get("kernels_bs1") if isinstance(results, dict) else None
    if not isinstance(kernels, dict):
        return None
    out: dict[str, dict[str, float]] = {}
    for form, per_kernel in kernels.items():
        if not isinstance(per_kernel, dict):
            continue
        times: dict[str, float] = {}
        for name, us in per_kernel.items():
            if _is_number(us) and us >= 0:
                label = _kernel_label(str(name))
                times[label] = times.get(label, 0.0) + float(us)
        if times:
            out[str(form)] = times
    return out or None


def _kernel_order(kernels: dict[str, dict[str, float]]) -> list[str]:
    """Every kernel label of :func:`_layer_kernels`: the known ones in the order they run, then the rest."""
    labels = list(dict.fromkeys(label for times in kernels.values() for label in times))
    known = [label for label in KERNEL_LABELS.values() if label in labels]
    return known + [label for label in labels if label not in known]


def _tile_sweep(data: dict) -> list[dict[str, Any]] | None:
    """``results.gemv_tiles_bs1``: the rows with a ``kernel``, its ``tiles`` and positive ``us``."""
    results = data.get("results")
    sweep = results.get("gemv_tiles_bs1") if isinstance(results, dict) else None
    if not isinstance(sweep, list):
        return None
    rows = [r for r in sweep if isinstance(r, dict) and isinstance(r.get("kernel"), str)
            and isinstance(r.get("tiles"), dict) and _positive(r.get("us"))]
    return rows or None


def _router_sweep(data: dict) -> list[dict[str, Any]] | None:
    """``results.router_tiles_bs1``: the decode router's tile choices, rows with ``tiles`` and positive ``us``."""
    results = data.get("results")
    sweep = results.get("router_tiles_bs1") if isinstance(results, dict) else None
    if not isinstance(sweep, list):
        return None
    rows = [r for r in sweep if isinstance(r, dict) and isinstance(r.get("tiles"), dict) and _positive(r.get("us"))]
    return rows or None


def _tiles_text(tiles: Any) -> str:
    """``16 × 256, 2 warps, 3 stages``: a ``Tiles`` as the file holds it (the parts it has)."""
    if not isinstance(tiles, dict):
        return "—"
    parts = [f"{tiles['block_n']} × {tiles['block_k']}"] if _is_number(tiles.get("block_n")) and \
        _is_number(tiles.get("block_k")) else []
    parts += [f"{tiles[k]} {word}{'' if tiles[k] == 1 else 's'}" for k, word in (("num_warps", "warp"), ("num_stages", "stage"))
              if _is_number(tiles.get(k))]
    return ", ".join(parts) or _fmt(tiles)


def _short_kernel(name: str) -> str:
    """A profiler's kernel name without its template and arguments: ``flashinfer::norm::RMSNormKernel``."""
    text = name.removeprefix("void ").strip()
    for stop in "<(":
        text = text.split(stop)[0]
    return text.strip() or name


def _decode_kinds(decode: dict[str, Any] | None) -> dict[str, Any] | None:
    """``results.decode_bs1.kernels``: one profiled bs=1 decode step, ``{"kinds": [(kind, kernels
    per step or None, µs per step, [(kernel name, µs per step)])], most µs first, "kernels": kernels
    per step or None, "us": their µs, "steps": steps profiled or None}``; None without a kind."""
    kernels = decode.get("kernels") if isinstance(decode, dict) else None
    by_kind = kernels.get("by_kind") if isinstance(kernels, dict) else None
    if not isinstance(by_kind, dict):
        return None
    kinds = []
    for kind, v in by_kind.items():
        if not isinstance(v, dict) or not _is_number(v.get("us_per_step")) or v["us_per_step"] < 0:
            continue
        count = float(v["kernels_per_step"]) if _is_number(v.get("kernels_per_step")) else None
        top = v.get("top_kernels_us_per_step")
        top = [(str(n), float(us)) for n, us in top.items() if _is_number(us)] if isinstance(top, dict) else []
        kinds.append((str(kind), count, float(v["us_per_step"]), sorted(top, key=lambda item: -item[1])))
    if not kinds:
        return None
    kinds.sort(key=lambda kind: -kind[2])
    if _is_number(kernels.get("kernels_per_step")):
        count = float(kernels["kernels_per_step"])
    else:
        count = sum(k[1] for k in kinds) if all(k[1] is not None for k in kinds) else None
    steps = kernels.get("steps")
    return {"kinds": kinds, "kernels": count, "us": sum(k[2] for k in kinds),
            "steps": steps if _positive(steps) else None}


def _expert_load(decode: dict[str, Any] | None) -> dict[str, Any] | None:
    """``results.decode_bs1.expert_load``: per layer, every expert's router choices (``counts``)
    over a workload, and ``busiest`` (the busiest expert's count over its layer's mean: the
    file's ``busiest_over_mean``, else computed), with the workload as the file names it; None
    without a layer of counts with a positive mean."""
    load = decode.get("expert_load") if isinstance(decode, dict) else None
    counts = load.get("counts") if isinstance(load, dict) else None
    if not isinstance(counts, list) or not counts:
        return None
    if not all(isinstance(c, list) and c and all(_is_number(v) and v >= 0 for v in c) and sum(c) > 0 for c in counts):
        return None
    busiest = load.get("busiest_over_mean")
    if not (isinstance(busiest, list) and len(busiest) == len(counts) and all(_positive(b) for b in busiest)):
        busiest = [max(c) / (sum(c) / len(c)) for c in counts]
    lengths = load.get("prompt_lengths")
    return {"counts": counts, "busiest": [float(b) for b in busiest],
            "requests": load.get("requests") if _positive(load.get("requests")) else None,
            "lengths": lengths if isinstance(lengths, list) and len(lengths) == 2 and all(_is_number(v) for v in lengths)
            else None,
            "new_tokens": load.get("new_tokens") if _positive(load.get("new_tokens")) else None,
            "note": load.get("note") if isinstance(load.get("note"), str) else None}


def _top_k(data: dict) -> int | None:
    model = _config(data).get("model_config")
    k = model.get("num_experts_per_tok") if isinstance(model, dict) else None
    return k if _positive(k) else None


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
    """Two panels over the batch size (log scale): µs per layer call of the fused path (each form
    where the file times both), the reference loop and the fused path's bytes bound (left, log
    scale); the fused path's share of its bytes bound with the bs=1 target (right). Below them,
    where the file has them: the two forms at small batch sizes and kernel by kernel at batch
    size 1 (:func:`_draw_forms`), a bs=1 decode step's kernels by kind
    (:func:`_draw_decode_kinds`) and the expert load (:func:`_draw_expert_load`). A file with
    only those parts: those parts. A file without layer rows but with the parallel comparison:
    :func:`_draw_parallel`. None with none of them."""
    from matplotlib.figure import Figure

    rows, decode = _layer_rows(data), _decode(data)
    small = [r for r in rows or [] if all(_positive(r.get(key)) for key, _ in FORMS)]
    kernels, kinds, load = _layer_kernels(data), _decode_kinds(decode), _expert_load(decode)
    if rows is None:
        parallel = _parallel(data)
        if parallel is not None:
            return _draw_parallel(data, parallel, theme)
    shape = _config(data).get("shape")
    where = f"{f' ({shape})' if shape else ''}{_on_hardware(data)}"
    if not (small or kernels or kinds or load):  # the layer sweep alone (the older files)
        if rows is None:
            return None
        fig = Figure(figsize=(PLOT_WIDTH_IN, 4.3), layout="constrained")
        _draw_layer(fig, rows, theme)
        fig.suptitle(f"Mixture-of-experts layer{where}", x=0.01, ha="left")
        return fig
    parts = []
    if rows is not None:
        parts.append((4.3, lambda panel: _draw_layer(panel, rows, theme)))
    if small or kernels:
        parts.append((3.3, lambda panel: _draw_forms(panel, small, kernels, _bs1(rows), _gemv_choice(data), theme)))
    if kinds:
        parts.append((_decode_kinds_height(kinds), lambda panel: _draw_decode_kinds(panel, kinds, decode, theme)))
    if load:
        parts.append((3.4, lambda panel: _draw_expert_load(panel, load, _top_k(data), theme)))
    what = "layer" if rows is not None or small or kernels else ""
    what += (" and decode at batch size 1" if what else "decode at batch size 1") if kinds or load else ""
    return _stacked_figure(parts, f"Mixture-of-experts {what}{where}")


def _form_points(rows: list[dict[str, Any]], key: str, value) -> tuple[list, list, list[int]]:
    """Batch sizes and ``value(row)`` of the rows that time the form ``key``, and the indices of
    those where the layer runs that form."""
    timed = [r for r in rows if _positive(r.get(key))]
    return ([r["batch_size"] for r in timed], [value(r) for r in timed],
            [i for i, r in enumerate(timed) if _runs_form(r) == key])


def _plot_form(ax, rows: list[dict[str, Any]], key: str, value, color: str, marker: str, label: str) -> None:
    """One form's line: filled markers where the layer runs it, hollow ones where it does not."""
    x, y, runs = _form_points(rows, key, value)
    ax.plot(x, y, color=color, marker=marker, markersize=4.5, linewidth=1.8, markevery=runs, label=label)
    others = [i for i in range(len(x)) if i not in runs]
    if others:
        ax.plot([x[i] for i in others], [y[i] for i in others], linestyle="none", marker=marker, markersize=4.5,
                markerfacecolor="none", markeredgecolor=color, label="_" + label)


def _draw_layer(fig, rows: list[dict[str, Any]], theme: dict[str, Any]) -> None:
    """The layer sweep's two panels and their legend, in ``fig`` (a figure or a subfigure)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator, PercentFormatter

    bs = [r["batch_size"] for r in rows]
    fused, reference, bound = ([r[k] for r in rows] for k in ("fused_us", "reference_us", "bytes_bound_us"))
    fraction = [r["fraction"] for r in rows]
    series = theme["series"]
    forms = _has_forms(rows)
    form_styles = {"grouped_us": (theme["accent"], MARKERS[0]), "gemv_us": (series[2], MARKERS[2])}

    times_ax, share_ax = fig.subplots(1, 2, sharex=True, gridspec_kw={"width_ratios": [1.15, 1]})
    if forms:
        lines = [(f"fused, {label} form (in a CUDA graph)", None, *form_styles[key], "-") for key, label in FORMS
                 if any(_positive(r.get(key)) for r in rows)]
        for key, label in FORMS:
            if any(_positive(r.get(key)) for r in rows):
                _plot_form(times_ax, rows, key, lambda r, key=key: r[key], *form_styles[key],
                           f"fused, {label} form (in a CUDA graph)")
    else:
        lines = [("fused (in a CUDA graph)", fused, theme["accent"], MARKERS[0], "-")]
    lines += [
        ("reference loop (eager)", reference, series[1], MARKERS[1], "-"),
        ("bytes bound of the fused path", bound, theme["fg"], None, "--"),
    ]
    for label, values, color, marker, style in lines:
        if values is not None:
            times_ax.plot(bs, values, color=color, marker=marker, markersize=4.5, linewidth=1.8 if marker else 1.2,
                          linestyle=style, label=label)
    times_ax.set_yscale("log")
    times_ax.set_ylabel("µs per layer call (log scale, lower is better)")
    times_ax.set_title("The MoE layer alone", loc="left")
    first = rows[0]  # the smallest batch: the fused path's speed-up under the reference's point
    times_ax.annotate(f"fused: {_faster(first['speedup'])}", (first["batch_size"], first["reference_us"]),
                      xytext=(6, -14), textcoords="offset points", fontsize=8.5, color=theme["accent"])

    if forms:
        for key, label in FORMS:
            if any(_positive(r.get(key)) for r in rows):
                _plot_form(share_ax, rows, key, lambda r, key=key: r["bytes_bound_us"] / r[key], *form_styles[key],
                           f"{label} form")
    else:
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
    shares = fraction + [r["bytes_bound_us"] / r[key] for r in rows for key, _ in FORMS if _positive(r.get(key))]
    share_ax.set_ylim(0, max([1.05] + [f * 1.08 for f in shares]))
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
    if forms:
        handles.append(Line2D([], [], color=theme["fg"], marker="o", markersize=4.5, linestyle="none",
                              markerfacecolor="none", label="hollow: a form the layer does not run there"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3)


def _draw_forms(fig, small: list[dict[str, Any]], kernels: dict[str, dict[str, float]] | None,
                bs1: dict[str, Any] | None, choice: dict[str, Any] | None, theme: dict[str, Any]) -> None:
    """The two forms up close: µs per layer call of each at the batch sizes that time both, with
    the bytes bound of each batch size and the form the layer runs drawn solid (left); device µs
    of each form's kernels at batch size 1, stacked, with the bytes bound there (right)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    axes = list(fig.subplots(1, int(bool(small)) + int(bool(kernels)), squeeze=False)[0])
    colors = {"grouped_us": theme["accent"], "gemv_us": theme["series"][2]}
    if small:
        ax = axes.pop(0)
        x = list(range(len(small)))
        for offset, (key, _) in zip((-0.2, 0.2), FORMS):
            values = [r[key] for r in small]
            alphas = [1.0 if _runs_form(r) == key else 0.4 for r in small]
            for xi, v, alpha in zip(x, values, alphas):
                ax.bar(xi + offset, v, width=0.38, color=colors[key], alpha=alpha, linewidth=0)
                ax.annotate(_number(v), (xi + offset, v), xytext=(0, 2), textcoords="offset points", ha="center",
                            fontsize=7.5)
        ax.hlines([r["bytes_bound_us"] for r in small], [xi - 0.42 for xi in x], [xi + 0.42 for xi in x],
                  color=theme["fg"], linestyle="--", linewidth=1.2)
        ax.set_xticks(x, [_fmt(r["batch_size"]) for r in small])
        ax.set_xlim(-0.6, len(small) - 0.4)
        ax.set_ylim(0, max(max(r[k] for k, _ in FORMS) for r in small) * 1.15)
        ax.grid(axis="x", visible=False)
        ax.set_xlabel("batch size (tokens per layer call)")
        ax.set_ylabel("µs per layer call (lower is better)")
        limit = choice.get("gemv_max_tokens") if choice else None
        title = "Both forms; solid: the one the layer runs"
        if _is_number(limit):
            title = (f"Both forms; matrix-vector up to {_fmt(limit)} token{'' if limit == 1 else 's'}" if limit > 0
                     else "Both forms; grouped at every batch size")
        ax.set_title(title, loc="left")
        handles = [Patch(color=colors[key], label=f"{label} form") for key, label in FORMS]
        handles.append(Line2D([], [], color=theme["fg"], linestyle="--", linewidth=1.2, label="bytes bound"))
        ax.legend(handles=handles, loc="upper left", fontsize=8.5)
    if kernels:
        ax = axes.pop(0)
        order = _kernel_order(kernels)
        palette = [theme["series"][i] for i in (3, 0, 2, 1, 4, 5, 6)] + [theme["other"]]
        kernel_colors = {label: palette[i % len(palette)] for i, label in enumerate(order)}
        forms = list(kernels)
        for yi, form in enumerate(forms):
            left = 0.0
            for label in order:
                us = kernels[form].get(label)
                if us is None:
                    continue
                ax.barh(yi, us, left=left, height=0.55, color=kernel_colors[label], linewidth=0)
                if us >= 4:
                    ax.annotate(_number(us), (left + us / 2, yi), ha="center", va="center", fontsize=7.5,
                                color=_text_on(kernel_colors[label]))
                left += us
            ax.annotate(_number(left, "µs"), (left, yi), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=8.5, fontweight="bold")
        top = max(sum(times.values()) for times in kernels.values())
        if bs1 is not None:
            ax.axvline(bs1["bytes_bound_us"], color=theme["fg"], linestyle="--", linewidth=1.2)
            ax.annotate(f"bytes bound {_number(bs1['bytes_bound_us'], 'µs')}", (bs1["bytes_bound_us"], 0.5),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=8, color=theme["muted"])
            top = max(top, bs1["bytes_bound_us"])
        _label_rows(ax, [FORM_LABELS.get(form, form) for form in forms])
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel("device µs per call at batch size 1 (profiled)")
        ax.set_title("Each form's kernels at batch size 1", loc="left")
        ax.legend(handles=[Patch(color=kernel_colors[label], label=label) for label in order], loc="upper center",
                  bbox_to_anchor=(0.5, -0.3), ncols=min(4, len(order)), fontsize=8.5)


def _text_on(color: str) -> str:
    """White or near-black, whichever reads on a ``#rrggbb`` background."""
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.6 else "#1b1d23"


DECODE_KIND_WRAP = 34  # kind labels longer than this many characters are wrapped


def _decode_kinds_height(kinds: dict[str, Any]) -> float:
    """Inches for :func:`_draw_decode_kinds`: a row per kind (more for a wrapped label), and the axes."""
    lines = sum(len(textwrap.wrap(kind, DECODE_KIND_WRAP)) or 1 for kind, *_ in kinds["kinds"])
    return 1.1 + 0.2 * lines + 0.12 * len(kinds["kinds"])


def _draw_decode_kinds(fig, kinds: dict[str, Any], decode: dict[str, Any], theme: dict[str, Any]) -> None:
    """A horizontal bar per kind of kernel of one bs=1 decode step (most device time first),
    labelled with its µs and kernel count; the MoE kernels in the accent colour."""
    from matplotlib.ticker import StrMethodFormatter

    ax = fig.subplots()
    rows = kinds["kinds"]
    for yi, (kind, count, us, _) in enumerate(rows):
        ax.barh(yi, us, height=0.62, linewidth=0, color=theme["accent"] if kind.startswith("MoE") else theme["other"])
        text = _number(us, "µs") + (f" · {_number(count)} kernel{'' if count == 1 else 's'}" if count is not None else "")
        ax.annotate(text, (us, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5)
    _label_rows(ax, ["\n".join(textwrap.wrap(kind, DECODE_KIND_WRAP)) or kind for kind, *_ in rows])
    ax.tick_params(axis="y", labelsize=8.5)
    ax.set_xlim(0, max(us for _, _, us, _ in rows) * 1.3 or 1.0)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel("device µs per decode step (kernel time, summed)")
    ax.set_title("Decode at batch size 1: one step's kernels by kind", loc="left")
    summary = [f"{_number(kinds['kernels'])} kernels, " if kinds["kernels"] is not None else ""]
    summary[0] += f"{_number(kinds['us'], 'µs')} per step"
    summary.append(f"{_number(decode['ms_per_token'], 'ms')} per token")
    if _positive(decode.get("roofline_ms")):
        summary[-1] += f"; roofline {_number(decode['roofline_ms'], 'ms')}"
    ax.annotate("\n".join(summary), (0.98, 0.06), xycoords="axes fraction", ha="right", va="bottom", fontsize=9,
                color=theme["fg"])


def _draw_expert_load(fig, load: dict[str, Any], top_k: int | None, theme: dict[str, Any]) -> None:
    """The expert-load histogram: every expert's choices over its layer's mean, all layers
    (left); the busiest expert of each layer over its layer's mean, with the median (right)."""
    counts, busiest = load["counts"], load["busiest"]
    hist_ax, layer_ax = fig.subplots(1, 2)
    ratios = [v / (sum(c) / len(c)) for c in counts for v in c]
    width = 0.1
    bins = [i * width for i in range(int(max(ratios) / width) + 2)]
    heights, _, _ = hist_ax.hist(ratios, bins=bins, color=theme["accent"], linewidth=0)
    hist_ax.set_ylim(0, max(heights) * 1.15)
    hist_ax.axvline(1.0, color=theme["fg"], linestyle="--", linewidth=1.2)
    hist_ax.annotate("even load", (1.0, 1.0), xycoords=("data", "axes fraction"), xytext=(4, -2),
                     textcoords="offset points", va="top", fontsize=8.5, color=theme["muted"])
    experts = {len(c) for c in counts}
    hist_ax.set_xlabel("an expert's choices over its layer's mean")
    hist_ax.set_ylabel(f"experts (of {len(counts)} layers" + (f" × {experts.pop()})" if len(experts) == 1 else ")"))
    hist_ax.set_title("Every expert's load", loc="left")

    layers = list(range(len(busiest)))
    layer_ax.bar(layers, busiest, width=0.8, color=theme["series"][1], linewidth=0)
    middle = statistics.median(busiest)
    layer_ax.axhline(middle, color=theme["fg"], linestyle="--", linewidth=1.2)
    layer_ax.axhline(1.0, color=theme["other"], linestyle=":", linewidth=1.0)
    layer_ax.set_ylim(0, max(busiest) * 1.15)
    layer_ax.set_xlim(-0.8, len(busiest) - 0.2)
    layer_ax.grid(axis="x", visible=False)
    layer_ax.set_xlabel("layer")
    layer_ax.set_ylabel("busiest expert over the mean")
    layer_ax.set_title(f"The busiest expert of each layer (median {_number(middle)}×)", loc="left")
    workload = _load_workload(load, top_k)
    fig.suptitle("Expert load" + (f" of {workload}" if workload else "") + ": random weights, an untrained router",
                 x=0.01, ha="left", fontsize=10.5)


def _load_workload(load: dict[str, Any], top_k: int | None) -> str:
    """``64 requests, 21,447 tokens``: what the expert-load counts are of, as far as the file says."""
    parts = [f"{_fmt(load['requests'])} requests"] if load["requests"] else []
    if top_k:
        parts.append(f"{_fmt(round(sum(load['counts'][0]) / top_k))} tokens")
    return ", ".join(parts)


def moe_section(res: BenchmarkResult) -> list[str] | None:
    """The workload, the two targets judged, the plot, a row per batch size (each form where the
    file times both), the two forms at batch size 1 and the tiles chosen, bs=1 decode against
    its roofline with its kernels by kind and the expert load, one GPU against TP and EP (with
    ``--parallel``) and any other numbers; None when the file has no layer rows, no decode and no
    parallel comparison."""
    data = res.data
    rows, decode, parallel = _layer_rows(data), _decode(data), _parallel(data)
    if rows is None and decode is None and parallel is None:
        return None
    kinds, load = _decode_kinds(decode), _expert_load(decode)
    out = _moe_headline(data, layer=rows is not None)
    if rows is not None or decode is not None:
        out += [_targets(rows, decode, _pdl_off_default(data)), ""]
        if rows is not None:
            out += _plot_markdown(res, _plot_alt(data, rows, decode))
            out += _layer_table(data, rows)
        out += _forms_part(data, rows)
        latency = _latency(data)
        out += ["", _latency_line(latency)] if latency else []
        out += ["", _decode_line(decode)]
        if rows is None and parallel is None and (kinds or load):  # drawn: those parts alone
            out += [""] + _plot_markdown(res, _plot_alt(data, rows, decode))[:-1]
        if kinds:
            out += [""] + _decode_kinds_table(kinds, decode)
        if load:
            out += ["", _expert_load_line(load, data)]
    if parallel is not None:
        out += ([""] if rows is not None or decode is not None else []) + _parallel_part(res, parallel, rows is None)
    results = data["results"]
    shown = {"copy_bandwidth_bytes_s"} | ({"layer"} if rows is not None else set())
    shown |= {"decode_bs1"} if decode is not None else set()
    shown |= {"parallel"} if parallel is not None else set()
    shown |= {key for key, there in (("kernels_bs1", _layer_kernels(data)), ("gemv_tiles_bs1", _tile_sweep(data)),
                                     ("gemv_choice", _gemv_choice(data)), ("router_tiles_bs1", _router_sweep(data)),
                                     ("latency_bs1", _latency(data) if rows is not None or decode is not None else None))
              if there}
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _plot_alt(data: dict, rows: list[dict[str, Any]] | None, decode: dict[str, Any] | None) -> str:
    """The chart's alternative text: what :func:`draw_moe` draws of this file."""
    parts = []
    if rows is not None:
        forms = " (each form where both were timed)" if _has_forms(rows) else ""
        parts.append(f"µs per MoE layer call against batch size for the fused path{forms}, the reference loop and the "
                     "bytes bound, and the fused path's share of its bytes bound")
    if any(all(_positive(r.get(key)) for key, _ in FORMS) for r in rows or []) or _layer_kernels(data):
        parts.append("the grouped and matrix-vector forms at small batch sizes and their kernels at batch size 1")
    if _decode_kinds(decode):
        parts.append("a batch-size-1 decode step's kernel time by kind")
    if _expert_load(decode):
        parts.append("the expert load: every expert's choices over its layer's mean, and each layer's busiest expert")
    return "; ".join(parts)


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
    pdl = _pdl_off_default(data)
    parts += [f"**{pdl}** (`MINISGL_PDL={_config(data)['pdl']}`; the engine's default is early)"] if pdl else []
    return [" · ".join(parts), ""] if parts else []


PDL_WORDS = {"0": "PDL off", "off": "PDL off", "late": "PDL late"}  # the modes other than the default, early


def _pdl_off_default(data: dict) -> str | None:
    """``"PDL off"`` or ``"PDL late"`` when the run's config records a programmatic dependent
    launch mode other than the default (``MINISGL_PDL``, written by ``benchmarks moe`` since
    the ``pdl`` key came in), else None (the default, or a file from before)."""
    return PDL_WORDS.get(str(_config(data).get("pdl", "early")).lower())


def _targets(rows: list[dict[str, Any]] | None, decode: dict[str, Any] | None, pdl: str | None = None) -> str:
    """Lesson 11's two targets, each reached or not as the file's numbers say (``pdl``: the run's
    launch mode when it is not the engine's default, said in the line)."""
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
    judged = f", judged on this run with {pdl} (not the engine's default)" if pdl else ""
    return f"Targets of {LESSON}{judged}: {layer}; {whole}."


LAYER_COLUMNS = ("batch size", "experts touched", "bytes", "fused", "reference", "fused speed-up", "bytes bound",
                 "fused, share of the bound")


def _layer_table(data: dict, rows: list[dict[str, Any]]) -> list[str]:
    """A row per batch size; where the file times both forms, a column per form (the one the layer
    runs in bold) instead of the fused path's one."""
    forms = _has_forms(rows)
    columns = LAYER_COLUMNS if not forms else \
        LAYER_COLUMNS[:3] + tuple(label for _, label in FORMS) + LAYER_COLUMNS[4:]
    out = ["**The MoE layer alone**, µs per call (the fused path inside a CUDA graph, the reference loop "
           "eagerly: it syncs with the host):", "",
           "| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for r in rows:
        touched, nbytes = r.get("experts_touched"), r.get("bytes")
        if forms:
            fused = [(f"**{_number(r[key], 'µs')}**" if _runs_form(r) == key else _number(r[key], "µs"))
                     if _positive(r.get(key)) else "—" for key, _ in FORMS]
        else:
            fused = [_number(r["fused_us"], "µs")]
        cells = [
            _fmt(r["batch_size"]),
            _fmt(touched) if _is_number(touched) else "—",
            _bytes(nbytes) if _is_number(nbytes) else "—",
            *fused,
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
    out += ["", "Bytes: the weights of the experts the batch touches (random routing), the input and the "
            f"output; the bytes bound is those bytes over {over}, and the share is the bound over the fused "
            "path's time."]
    if forms:
        timed = [r["batch_size"] for r in rows if _positive(r.get("gemv_us"))]
        upto = f", the matrix-vector one timed up to {_fmt(max(timed))} tokens" if timed and \
            len(timed) < len(rows) else ""
        out[-1] += (f" Grouped and matrix-vector: the layer's two forms (`fused_moe(path=…)`){upto}; in bold the one "
                    "the layer runs at that batch size (`path=\"auto\"`), whose speed-up and share the other columns "
                    "give.")
    return out


def _forms_part(data: dict, rows: list[dict[str, Any]] | None) -> list[str]:
    """The crossover and tiles chosen in this run, each form's kernels at batch size 1, and the
    matrix-vector form's tile sweep (every tile folded away); ``[]`` when the file has none."""
    choice, kernels, sweep = _gemv_choice(data), _layer_kernels(data), _tile_sweep(data)
    out: list[str] = []
    if choice is not None:
        limit = choice["gemv_max_tokens"]
        if limit > 0:
            after = _grouped_from(rows, limit)
            text = (f"**Chosen in this run** (`--gemv-tiles`): the matrix-vector form up to {_fmt(limit)} "
                    f"token{'' if limit == 1 else 's'}" + (f", the grouped one from {_fmt(after)} (the next batch size "
                                                          "measured)" if after else ""))
        else:
            text = "**Chosen in this run** (`--gemv-tiles`): the grouped form at every batch size"
        tiles = [f"{_kernel_label(k)} {_tiles_text(choice[f'{k}_tiles'])}" for k in ("gate_up", "down")
                 if isinstance(choice.get(f"{k}_tiles"), dict)]
        out += ["", text + "." + (" Its tiles: " + "; ".join(tiles) + "." if tiles else "")]
    if kernels:
        order, forms = _kernel_order(kernels), list(kernels)
        bs1 = _bs1(rows)
        bound = f"; the bytes bound there is {_number(bs1['bytes_bound_us'], 'µs')}" if bs1 is not None else ""
        out += ["", f"**The two forms at batch size 1**, device µs per call of each kernel (profiled over eager "
                f"calls{bound}):", "",
                "| kernel | " + " | ".join(_md_cell(FORM_LABELS.get(f, f)) for f in forms) + " |",
                "|---|" + "---:|" * len(forms)]
        for label in order:
            cells = [_number(kernels[f][label], "µs") if label in kernels[f] else "—" for f in forms]
            out.append(f"| {_md_cell(label)} | " + " | ".join(cells) + " |")
        out.append("| **all kernels** | " + " | ".join(f"**{_number(sum(kernels[f].values()), 'µs')}**" for f in forms)
                   + " |")
    if sweep:
        ranges = []
        for kernel in dict.fromkeys(r["kernel"] for r in sweep):
            tried = [r for r in sweep if r["kernel"] == kernel]
            best, worst = min(tried, key=lambda r: r["us"]), max(tried, key=lambda r: r["us"])
            share = f"; {_pct(best['fraction_of_bytes_bound'])} of the bytes bound" \
                if _is_number(best.get("fraction_of_bytes_bound")) else ""
            ranges.append(f"{_md_cell(_kernel_label(kernel))} from {_number(best['us'], 'µs')} "
                          f"({_tiles_text(best['tiles'])}{share}) to {_number(worst['us'], 'µs')}")
        out += ["", f"**The matrix-vector form's tiles at batch size 1**: the layer's µs in a CUDA graph with one "
                f"kernel's tiles varied, the other's at its default, over {len(sweep)} tries: "
                + "; ".join(ranges) + ".", ""]
        table = ["| kernel | tiles | µs | share of the bytes bound |", "|---|---|---:|---:|"]
        table += [f"| {_md_cell(_kernel_label(r['kernel']))} | {_tiles_text(r['tiles'])} | {_number(r['us'], 'µs')} | "
                  + (_pct(r["fraction_of_bytes_bound"]) if _is_number(r.get("fraction_of_bytes_bound")) else "—") + " |"
                  for r in sweep]
        out += ['??? info "Every tile tried"', ""] + ["    " + line for line in table]
    router = _router_sweep(data)
    if router:
        best, worst = min(router, key=lambda r: r["us"]), max(router, key=lambda r: r["us"])
        out += ["", f"**The decode router** (logits, softmax and top-k in one launch) at batch size 1, µs in a CUDA "
                f"graph over {len(router)} tile choices: from {_number(best['us'], 'µs')} ({_tiles_text(best['tiles'])}) "
                f"to {_number(worst['us'], 'µs')}.", ""]
        table = ["| tiles | µs |", "|---|---:|"] + [f"| {_tiles_text(r['tiles'])} | {_number(r['us'], 'µs')} |"
                                                    for r in router]
        out += ['??? info "Every router tile tried"', ""] + ["    " + line for line in table]
    return out


def _decode_kinds_table(kinds: dict[str, Any], decode: dict[str, Any]) -> list[str]:
    """A row per kind of kernel of a bs=1 decode step (most time first), with its costliest kernels."""
    steps = f" (profiled over {_fmt(kinds['steps'])} steps)" if kinds["steps"] else ""
    count = f"{_number(kinds['kernels'])} kernels, " if kinds["kernels"] is not None else ""
    ms = decode["ms_per_token"]
    out = [f"**One bs=1 decode step's kernels by kind**{steps}: {count}{_number(kinds['us'], 'µs')} of kernel time per "
           f"step, {_pct(kinds['us'] / (1e3 * ms))} of the {_number(ms, 'ms')} per token (measured without the "
           "profiler):", "",
           "| kind | kernels per step | µs per step | share of the kernel time | costliest kernels, µs per step |",
           "|---|---:|---:|---:|---|"]
    for kind, n, us, top in kinds["kinds"]:
        names = ", ".join(f"`{_md_cell(_short_kernel(name))}` {_number(t)}" for name, t in top) or "—"
        out.append(f"| {_md_cell(kind)} | {_number(n) if n is not None else '—'} | {_number(us, 'µs')} | "
                   f"{_pct(us / kinds['us']) if kinds['us'] else '—'} | {names} |")
    return out


def _expert_load_line(load: dict[str, Any], data: dict) -> str:
    """The workload the router choices were counted over, the busiest and idlest expert of a
    layer over its mean (medians over the layers, and the range of the busiest), the file's note."""
    counts, busiest = load["counts"], load["busiest"]
    top_k = _top_k(data)
    what = [f"{_fmt(load['requests'])} requests"] if load["requests"] else []
    if load["lengths"]:
        lo, hi = load["lengths"]
        what.append(f"prompts of {_fmt(lo)}–{_fmt(hi)} random tokens")
    if load["new_tokens"]:
        what.append(f"{_fmt(load['new_tokens'])} new tokens each")
    experts = {len(c) for c in counts}
    if top_k:
        of = f" of {experts.pop()}" if len(experts) == 1 else ""
        what.append(f"{_fmt(round(sum(counts[0]) / top_k))} tokens, each choosing {top_k}{of} experts in each of "
                    f"{len(counts)} layers")
    idlest = statistics.median(min(c) / (sum(c) / len(c)) for c in counts)
    text = ("**Expert load**" + (f" of a workload ({'; '.join(what)})" if what else "")
            + f": the busiest expert of a layer got **{_number(statistics.median(busiest))}×** its layer's mean choices "
            f"(the median over the layers; from {_number(min(busiest))}× to {_number(max(busiest))}×), the idlest "
            f"{_number(idlest)}× (median).")
    note = load["note"] or "random weights: this is an untrained router's load"
    return text + f" {note[:1].upper() + note[1:]}."


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
