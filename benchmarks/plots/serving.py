"""``serving`` results: requests arriving over time at the HTTP server, measured with sglang
bench_serving's metrics: latency percentiles and throughput against the request rate, and the
radix cache and chunked prefill off and on through the server.

:func:`draw_serving` draws the chart (a matplotlib figure), :func:`serving_section` writes the
Benchmarks page section (Markdown)."""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from .chunked import _lower_text
from .common import (
    MARKERS,
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _flatten,
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

SERVING_LATENCIES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E"}
SERVING_THROUGHPUTS = {"output_throughput": "output tok/s", "input_throughput": "input tok/s",
                       "request_throughput": "completed req/s"}
SERVING_PERCENTILES = ("p50", "p90", "p99")
SERVING_CURVE_PANELS = ("ttft", "tpot", "e2e")  # the latency panels of the curve, left to right
# A metric of a run, named the way the benchmark names its on/off ratios: ``output_throughput``,
# ``ttft_p50``, and with a request tag first, ``short_ttft_p99`` (that tag's requests only).
_SERVING_KEY_RE = re.compile(r"(?:(?P<tag>[a-z]+)_)??(?:(?P<latency>ttft|tpot|itl|e2e)_(?P<stat>p\d+|mean)"
                             r"|(?P<throughput>output|input|request)_throughput)")


@dataclass(frozen=True)
class ServingComparison:
    """How a feature's off and on runs through the server (``results[key]``) are shown."""

    key: str
    feature: str  # "Radix cache"
    off: str  # the off run's label
    on: str  # the on run's label (``{size}``: the comparison's chunked_prefill_size)
    panels: tuple[str, ...]  # the metrics drawn, a small panel each (named as in _SERVING_KEY_RE)
    rows: tuple[str, ...]  # the metrics of the table, before any other ratio the file has
    headline: tuple[str, ...]  # the ratios in bold


SERVING_COMPARISONS = (
    ServingComparison("radix", "Radix cache", "cache off", "cache on",
                      panels=("ttft_p50", "ttft_p99", "e2e_p50", "output_throughput"),
                      rows=("output_throughput", "request_throughput", "ttft_p50", "ttft_p99", "tpot_p50",
                            "itl_p99", "e2e_p50", "e2e_p99"),
                      headline=("output_throughput", "ttft_p50")),
    ServingComparison("chunked", "Chunked prefill", "whole prompts", "chunks of {size}",
                      panels=("short_ttft_p50", "short_ttft_p99", "long_ttft_p50", "output_throughput"),
                      rows=("output_throughput", "short_ttft_p50", "short_ttft_p90", "short_ttft_p99",
                            "short_tpot_p50", "short_e2e_p50", "long_ttft_p50", "long_e2e_p50"),
                      headline=("short_ttft_p99",)),
)


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (the benchmark writes NaN for an empty sample)."""
    return float(v) if _is_number(v) and math.isfinite(v) else None


def _serving_key(key: str) -> tuple[str | None, str, str | None] | None:
    """``(tag, field, stat)`` of a metric's name: ``short_ttft_p99`` is ``("short", "ttft_ms",
    "p99")``, ``output_throughput`` is ``(None, "output_throughput", None)``; None if unknown."""
    m = _SERVING_KEY_RE.fullmatch(key)
    if m is None:
        return None
    if m.group("latency"):
        return m.group("tag"), f"{m.group('latency')}_ms", m.group("stat")
    return m.group("tag"), f"{m.group('throughput')}_throughput", None


def _serving_value(metrics: Any, key: str) -> float | None:
    """The metric named ``key`` of one run (a tag's from its ``by_tag``), or None."""
    parsed = _serving_key(key)
    if parsed is None or not isinstance(metrics, dict):
        return None
    tag, name, stat = parsed
    if tag is not None:
        by_tag = metrics.get("by_tag")
        metrics = by_tag.get(tag) if isinstance(by_tag, dict) else None
        if not isinstance(metrics, dict):
            return None
    value = metrics.get(name)
    if stat is not None:
        value = value.get(stat) if isinstance(value, dict) else None
    return _finite(value)


def _serving_lower_is_better(key: str) -> bool:
    """Latencies are better lower, throughputs higher."""
    parsed = _serving_key(key)
    return parsed is not None and parsed[2] is not None


def _serving_label(key: str) -> str:
    """``TTFT p99``, ``output tok/s``, ``short-request TTFT p99``: a metric's name for a reader."""
    parsed = _serving_key(key)
    if parsed is None:
        return key.replace("_", " ")
    tag, name, stat = parsed
    text = f"{SERVING_LATENCIES[name]} {stat}" if stat else SERVING_THROUGHPUTS[name]
    return f"{tag}-request {text}" if tag else text


def _serving_run_ok(metrics: Any) -> bool:
    """A run's metrics with a numeric output throughput and TTFT p50: enough to show it."""
    return _serving_value(metrics, "output_throughput") is not None and _serving_value(metrics, "ttft_p50") is not None


def _serving_curve(data: dict) -> dict:
    """``results.curve``, or ``{}``."""
    results = data.get("results")
    curve = results.get("curve") if isinstance(results, dict) else None
    return curve if isinstance(curve, dict) else {}


def _serving_points(data: dict) -> list[dict] | None:
    """The usable points of ``results.curve``: those paced at a positive request rate, by rate,
    then those sent all at once (``request_rate`` null); None without any."""
    points = _serving_curve(data).get("points")
    if not isinstance(points, list):
        return None
    usable = [p for p in points if _serving_run_ok(p)
              and (p.get("request_rate") is None or (_is_number(p["request_rate"]) and p["request_rate"] > 0))]
    paced = sorted((p for p in usable if p.get("request_rate") is not None), key=lambda p: p["request_rate"])
    return paced + [p for p in usable if p.get("request_rate") is None] or None


def _serving_comparisons(data: dict) -> list[tuple[ServingComparison, dict]]:
    """``(spec, results[spec.key])`` for each comparison of the file whose two runs are usable."""
    results = data.get("results")
    found = []
    for spec in SERVING_COMPARISONS:
        comp = results.get(spec.key) if isinstance(results, dict) else None
        if isinstance(comp, dict) and _serving_run_ok(comp.get("on")) and _serving_run_ok(comp.get("off")):
            found.append((spec, comp))
    return found


@dataclass(frozen=True)
class ServingSetting:
    """A run of a comparison with the feature on, compared with the comparison's ``off`` run."""

    label: str  # "cache on", "chunks of 8,192"
    metrics: dict
    ratios: dict  # the file's ratios against off, ``{}`` when it has none


def _serving_settings(spec: ServingComparison, comp: dict) -> list[ServingSetting]:
    """The comparison's runs with the feature on: ``on``, then each usable run of ``variants``
    (chunked prefill at more chunk sizes: ``chunked_prefill_size``, ``metrics``, ``ratios``)."""
    def ratios(v: Any) -> dict:
        return v if isinstance(v, dict) else {}

    settings = [ServingSetting(_serving_on_label(spec, comp.get("chunked_prefill_size")), comp["on"], ratios(comp.get("ratios")))]
    for v in comp.get("variants") if isinstance(comp.get("variants"), list) else []:
        if isinstance(v, dict) and _serving_run_ok(v.get("metrics")):
            label = _serving_on_label(spec, v.get("chunked_prefill_size"))
            settings.append(ServingSetting(label, v["metrics"], ratios(v.get("ratios"))))
    return settings


def _serving_ratio(setting: ServingSetting, off: dict, key: str) -> float | None:
    """A setting against the off run for the metric ``key``, above 1 when on is better
    (throughput on/off, latency off/on): the file's ratio, else computed from the two runs."""
    given = _finite(setting.ratios.get(key))
    if given is not None:
        return given
    on, off = _serving_value(setting.metrics, key), _serving_value(off, key)
    if on is None or off is None:
        return None
    better, worse = (off, on) if _serving_lower_is_better(key) else (on, off)
    return better / worse if worse > 0 else None


def _serving_ratio_text(key: str, ratio: float | None, bold: bool = False) -> str:
    """``5.1× lower`` for a latency, ``2.88×`` (``1.00×``: three digits) for a throughput
    (``—`` for None)."""
    if ratio is None or ratio <= 0:
        return "—"
    if _serving_lower_is_better(key):
        text = _lower_text(ratio)
    else:
        text = f"{ratio:#.3g}×" if ratio < 100 else f"{_number(ratio)}×"
    return f"**{text}**" if bold else text


def _serving_on_label(spec: ServingComparison, size: Any) -> str:
    """An on run's label: ``chunks of 8,192`` with its chunk size (``chunked`` when the file
    names none)."""
    if "{size}" not in spec.on:
        return spec.on
    return spec.on.format(size=f"{int(size):,}") if _is_number(size) and size > 0 else "chunked"


def _serving_cap(point: dict) -> int | None:
    """The run's cap on requests in flight, or None."""
    cap = point.get("max_concurrency")
    return int(cap) if _is_number(cap) and cap > 0 else None


def _serving_rate_label(point: dict, tick: bool = False) -> str:
    """``8 req/s`` or ``all at once``, with ``≤ 32 in flight`` when the run capped the requests
    in flight; ``tick``: the short form for the axis (a paced point's rate alone)."""
    rate = point.get("request_rate")
    if rate is None:
        text = "all\nat once" if tick else "all at once"
    else:
        text = _number(rate) if tick else f"{_number(rate)} req/s"
    cap = _serving_cap(point)
    if cap is not None and not (tick and rate is not None):
        text += f"\n≤ {cap:,} in flight" if tick else f", ≤ {cap:,} in flight"
    return text


def _serving_x(points: list[dict]) -> tuple[list[float], bool, float | None]:
    """Where each point goes on the rate axis, whether the axis is logarithmic (rates spread over
    8× or more), and where the separator between the paced and the all-at-once points goes
    (None unless both kinds are there). An all-at-once point has no rate: it gets a slot right
    of the highest rate, one step further than the rates are apart, and no number on the axis
    (whose ticks are the measured rates)."""
    rates = [float(p["request_rate"]) for p in points if p.get("request_rate") is not None]
    unpaced = len(points) - len(rates)
    if not rates:
        return [float(i + 1) for i in range(unpaced)], False, None
    log = max(rates) / min(rates) >= 8
    if log:
        slots = [max(rates) * 2.0 ** (1 + i) for i in range(unpaced)]
        separator = max(rates) * 2.0 ** 0.5
    else:
        gap = (max(rates) - min(rates)) / (len(rates) - 1) if len(rates) > 1 else max(rates) / 2
        slots = [max(rates) + gap * (1.5 + i) for i in range(unpaced)]
        separator = max(rates) + 0.75 * gap
    return rates + slots, log, separator if unpaced else None


def _serving_tick_labels(points: list[dict], xs: list[float], log: bool) -> list[str]:
    """The rate axis' labels: each point's (:func:`_serving_rate_label`), a rate's left out when
    it would touch the last one shown (it keeps its tick mark)."""
    where = [math.log2(x) for x in xs] if log else xs
    min_gap = 0.1 * (max(where) - min(where))
    labels, last = [], None
    for point, at in zip(points, where):
        crowded = last is not None and at - last < min_gap and point.get("request_rate") is not None
        labels.append("" if crowded else _serving_rate_label(point, tick=True))
        last = last if crowded else at
    return labels


def _number_formatter() -> Any:
    """A tick formatter that writes values as :func:`_number` does (and 0 as ``0``)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: _number(v) if v else "0")


def _serving_y_scale(ax: Any, values: list[float]) -> None:
    """A latency axis: logarithmic when the values span more than 30×, else linear from 0."""
    from matplotlib.ticker import LogLocator, NullLocator

    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 30:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.set_ylim(0, max(values, default=0.0) * 1.12 or 1.0)
    ax.yaxis.set_major_formatter(_number_formatter())


def _plot_serving_series(ax: Any, xs: list[float], values: list[float | None], paced: list[int],
                         unpaced: list[int], color: str, marker: str) -> list[float]:
    """One series of the curve: the paced points joined by a line, the all-at-once ones as lone
    markers; returns the values drawn."""
    for indices, joined in ((paced, True), (unpaced, False)):
        shown = [(xs[i], values[i]) for i in indices if values[i] is not None]
        if shown:
            ax.plot(*zip(*shown), color=color, marker=marker, markersize=4.5, linewidth=1.8,
                    linestyle="-" if joined else "none")
    return [v for v in values if v is not None]


def _draw_serving_curve(panel: Any, points: list[dict], theme: dict[str, Any], title: str) -> None:
    """Six panels on one rate axis: TTFT, TPOT and E2E (a p50, p90 and p99 line each) above
    output tok/s, requests completed per second (against the offered rate) and the mean
    requests in flight. Paced points are joined by lines; an all-at-once point stands alone
    right of a dotted separator, ticked "all at once"."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    xs, log, separator = _serving_x(points)
    paced = [i for i, p in enumerate(points) if p.get("request_rate") is not None]
    unpaced = [i for i, p in enumerate(points) if p.get("request_rate") is None]
    axes = panel.subplots(2, 3, sharex=True)
    styles = {q: (theme["series"][i], MARKERS[i]) for i, q in enumerate(SERVING_PERCENTILES)}
    for ax, metric in zip(axes[0], SERVING_CURVE_PANELS):
        drawn = []
        for q, (color, marker) in styles.items():
            values = [_serving_value(p, f"{metric}_{q}") for p in points]
            drawn += _plot_serving_series(ax, xs, values, paced, unpaced, color, marker)
        _serving_y_scale(ax, drawn)
        ax.set_title(f"{SERVING_LATENCIES[metric + '_ms']} (ms)", loc="left", fontsize=10)
    lower = (("output_throughput", "output tokens per second"), ("request_throughput", "requests completed per second"),
             ("concurrency", "requests in flight (mean)"))
    for ax, (key, label) in zip(axes[1], lower):
        values = [_finite(p.get(key)) for p in points]
        drawn = _plot_serving_series(ax, xs, values, paced, unpaced, theme["series"][4], "o")
        if key == "request_throughput" and paced:  # a server that keeps up completes what is offered
            rates = [xs[i] for i in paced]
            ax.plot(rates, rates, color=theme["muted"], linestyle="--", linewidth=1.2)
            drawn += rates
        ax.set_ylim(0, max(drawn, default=0.0) * 1.15 or 1.0)
        ax.yaxis.set_major_formatter(_number_formatter())
        ax.set_title(label, loc="left", fontsize=10)
    ticks = _serving_tick_labels(points, xs, log)
    for ax in axes.flat:
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, ticks)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelsize=8.5)
        if separator is not None:
            ax.axvline(separator, color=theme["muted"], linestyle=":", linewidth=1.2)
    lo, hi = min(xs), max(xs)
    if log:
        axes[0][0].set_xlim(lo / 1.4, hi * 1.4)
    else:
        pad = 0.1 * (hi - lo) or 0.5
        axes[0][0].set_xlim(lo - pad, hi + pad)
    handles = [Line2D([], [], color=color, marker=marker, markersize=4.5, linewidth=1.8, label=q)
               for q, (color, marker) in styles.items()]
    if paced:
        handles.append(Line2D([], [], color=theme["muted"], linestyle="--", linewidth=1.2, label="completed = offered"))
    panel.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    if paced:  # on each bottom panel: a figure-wide label would overlap the legend below them
        for ax in axes[1]:
            ax.set_xlabel(f"offered request rate (req/s{', log scale' if log else ''})", fontsize=9)
    _part_title(panel, title)


SERVING_BAR_IN = 0.3  # inches per bar of a comparison panel


def _serving_comparison_height(spec: ServingComparison, comp: dict) -> float:
    """Inches for :func:`_draw_serving_comparison`: its title, and two panels a row."""
    rows = -(-len(_serving_panel_keys(spec, comp)) // 2)
    return 0.55 + rows * (0.6 + SERVING_BAR_IN * (1 + len(_serving_settings(spec, comp))))


def _serving_panel_keys(spec: ServingComparison, comp: dict) -> list[str]:
    """The metrics of ``spec.panels`` that every run of the comparison has."""
    runs = [comp["off"], *(s.metrics for s in _serving_settings(spec, comp))]
    return [k for k in spec.panels if all(_serving_value(run, k) is not None for run in runs)]


def _draw_serving_comparison(panel: Any, spec: ServingComparison, comp: dict, theme: dict[str, Any], title: str) -> None:
    """A panel per metric of ``spec.panels`` that the runs have, two a row: a horizontal bar for
    the off run and one per setting with the feature on, each labelled with its value, an on
    bar also (in bold) with its ratio to off."""
    from matplotlib.ticker import MaxNLocator

    off, settings = comp["off"], _serving_settings(spec, comp)
    keys = _serving_panel_keys(spec, comp)
    grid = panel.subplots(-(-len(keys) // 2), 2, sharey=True, squeeze=False)
    for ax in grid.flat[len(keys):]:
        ax.set_visible(False)
    labels = [spec.off, *(s.label for s in settings)]
    for ax, key in zip(grid.flat, keys):
        values = [_serving_value(run, key) for run in [off, *(s.metrics for s in settings)]]
        y = list(range(len(values)))
        ax.barh(y, values, height=0.64, color=[theme["other"]] + [theme["accent"]] * len(settings))
        ax.annotate(_number(values[0]), (values[0], 0), xytext=(5, 0), textcoords="offset points", va="center", fontsize=8.5)
        for yi, setting, value in zip(y[1:], settings, values[1:]):
            ratio = _serving_ratio(setting, off, key)
            note = _number(value) + (f"   →  {_serving_ratio_text(key, ratio)}" if ratio is not None else "")
            ax.annotate(note, (value, yi), xytext=(5, 0), textcoords="offset points", va="center", fontsize=8.5,
                        fontweight="bold" if ratio is not None else "normal")
        _label_rows(ax, labels)
        ax.set_xlim(0, max(values) * 1.7 or 1.0)  # room for the labels
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.xaxis.set_major_formatter(_number_formatter())
        ax.tick_params(axis="x", labelsize=8.5)
        unit = " (ms)" if _serving_lower_is_better(key) else ""
        ax.set_title(_serving_label(key) + unit, loc="left", fontsize=9.5)
    _part_title(panel, title)


def _serving_lengths(full: int, ratio: Any) -> str:
    """``512–1,024`` for lengths uniform in ``[round(full * ratio), full]`` (``1,024`` when
    every request has ``full``: no ratio, or 1)."""
    low = max(1, round(full * ratio)) if _is_number(ratio) and 0 < ratio < 1 else full
    return f"{low:,}–{full:,}" if low != full else f"{full:,}"


def _serving_workload(workload: Any, short: bool = False) -> str:
    """A workload of the benchmark in words (``short``: for a plot title); ``—`` for none."""
    if not isinstance(workload, dict) or not workload:
        return "—"
    w = {k: v for k, v in workload.items() if _is_number(v)}
    kind = workload.get("kind")
    if kind == "random" and {"num_prompts", "input_len", "output_len"} <= set(w):
        ins, outs = (_serving_lengths(w[k], w.get("range_ratio")) for k in ("input_len", "output_len"))
        if short:
            return f"{w['num_prompts']:,} requests, {ins} tokens in, {outs} out"
        spread = " (uniform)" if "–" in ins + outs else ""
        return f"{w['num_prompts']:,} requests of random token ids, input {ins} and output {outs} tokens{spread}"
    if kind == "shared-prefix" and {"groups", "per_group", "system_len", "question_len", "output_len"} <= set(w):
        if short:
            return f"{w['groups']} groups × {w['per_group']} requests sharing {w['system_len']:,}-token prefixes"
        return (f"{w['groups'] * w['per_group']:,} requests = {w['groups']} groups × {w['per_group']}, a "
                f"{w['system_len']:,}-token system prompt shared by a group + a {w['question_len']:,}-token question, "
                f"{w['output_len']:,}-token answers")
    if kind == "long+short" and {"num_short", "short_input_len", "output_len", "num_long", "long_len"} <= set(w):
        if short:
            return f"{w['num_short']:,} short requests and {w['num_long']} long ({w['long_len']:,} tokens)"
        return (f"{w['num_short']:,} short requests ({w['short_input_len']:,}-token prompts) with {w['num_long']} long "
                f"ones ({w['long_len']:,}-token prompts) among them, {w['output_len']:,}-token answers")
    return ", ".join(f"{_md_cell(str(k).replace('_', ' '))} {_fmt(v)}" for k, v in workload.items())


def _serving_arrivals(rate: Any) -> str:
    """``all at once`` or ``Poisson arrivals at 16 req/s``."""
    return f"Poisson arrivals at {_number(rate)} req/s" if _is_number(rate) and rate > 0 else "all at once"


def _and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _serving_curve_arrivals(points: list[dict]) -> str:
    """``Poisson arrivals at 21, 41 and 62 req/s, and all at once``."""
    rates = [_number(p["request_rate"]) for p in points if p.get("request_rate") is not None]
    parts = [f"Poisson arrivals at {_and_list(rates)} req/s"] if rates else []
    if any(p.get("request_rate") is None for p in points):
        parts.append("all at once")
    caps = sorted({_serving_cap(p) for p in points if _serving_cap(p) is not None})
    text = ", and ".join(parts)
    return text + (f"; at most {_and_list([f'{c:,}' for c in caps])} requests in flight" if caps else "")


def _serving_where(data: dict) -> str:
    """The end of the plot's title: `` at http://…`` for a run against a given server (the file's
    hardware is then the client's), else `` on NVIDIA H200``."""
    url = _config(data).get("base_url")
    return f" at {url}" if url else _on_hardware(data)


def draw_serving(data: dict, theme: dict[str, Any]):
    """The curve (latency percentiles, throughput and requests in flight against the request
    rate) above a row of small on/off panels for each comparison the file has (the radix cache,
    chunked prefill); those the file has, each under a title of its own."""
    from matplotlib.figure import Figure

    points, comparisons = _serving_points(data), _serving_comparisons(data)
    if points is None and not comparisons:
        return None
    parts: list[tuple[float, Any, tuple]] = []  # (height in inches, draw(panel, *args), args)
    if points is not None:
        workload = _serving_workload(_serving_curve(data).get("workload"), short=True)
        paced = any(p.get("request_rate") is not None for p in points)
        title = f"Against the request rate (Poisson arrivals): {workload}" if paced else f"All requests at once: {workload}"
        parts.append((5.4, _draw_serving_curve, (points, theme, title)))
    for spec, comp in comparisons:
        arrivals = _serving_arrivals(comp.get("request_rate")).replace("Poisson arrivals", "Poisson")
        title = f"{spec.feature} off and on: {_serving_workload(comp.get('workload'), short=True)}, {arrivals}"
        parts.append((_serving_comparison_height(spec, comp), _draw_serving_comparison, (spec, comp, theme, title)))
    heights = [height for height, _, _ in parts]
    fig = Figure(figsize=(PLOT_WIDTH_IN, sum(heights) + 0.4), layout="constrained")
    panels = fig.subfigures(len(parts), 1, height_ratios=heights, squeeze=False)[:, 0]
    for panel, (_, draw, args) in zip(panels, parts):
        draw(panel, *args)
    fig.suptitle(f"Serving through HTTP{_serving_where(data)}", x=0.01, ha="left")
    return fig


def _part_title(panel: Any, title: str) -> None:
    """The title of one part of a stacked figure: left, a size below the figure's, wrapped."""
    panel.suptitle("\n".join(textwrap.wrap(title, 95)), x=0.01, ha="left", fontsize=11, fontweight="bold")


def serving_section(res: BenchmarkResult) -> list[str] | None:
    """The setup and the headline numbers, the plot, the curve's table (every metric of every
    point folded away) and a table per comparison; None when the file has none of them."""
    data = res.data
    points, comparisons = _serving_points(data), _serving_comparisons(data)
    if points is None and not comparisons:
        return None
    out = _serving_headline(data)
    drawn = ["latency percentiles, throughput and requests in flight against the request rate"] if points else []
    drawn += [f"{spec.feature.lower()} off and on" for spec, _ in comparisons]
    out += _plot_markdown(res, "Serving through HTTP: " + _and_list(drawn))
    if points is not None:
        out += [f"**Against the request rate**: {_serving_workload(_serving_curve(data).get('workload'))}; "
                f"{_serving_curve_arrivals(points)}.", ""] + _serving_curve_table(points)
    for spec, comp in comparisons:
        out += ["", f"**{spec.feature} off and on**: {_serving_workload(comp.get('workload'))}; "
                f"{_serving_arrivals(comp.get('request_rate'))}.", ""] + _serving_comparison_table(spec, comp)
    shown = ({"curve"} if points is not None else set()) | {spec.key for spec, _ in comparisons}
    rest = {k: v for k, v in data["results"].items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


SERVING_CURVE_HEAD = ("| arrivals | completed req/s | output tok/s | in flight (mean) | TTFT p50 | TTFT p99 | TPOT p50 "
                      "| TPOT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 | failed |")


def _serving_curve_table(points: list[dict]) -> list[str]:
    """A row per point (by rate, all at once last): throughputs, requests in flight, the p50 and
    p99 of each latency in ms and the failed requests; the definitions under it, then every
    metric of every point in a fold-out table."""
    out = [SERVING_CURVE_HEAD, "|---|" + "---:|" * 12]
    for p in points:
        cells = [_serving_rate_label(p)]
        for key in ("request_throughput", "output_throughput", "concurrency"):
            value = _finite(p.get(key))
            cells.append(_number(value) if value is not None else "—")
        for metric in ("ttft", "tpot", "itl", "e2e"):
            for q in ("p50", "p99"):
                value = _serving_value(p, f"{metric}_{q}")
                cells.append(_number(value) if value is not None else "—")
        failed = p.get("failed")
        cells.append((f"**{failed:,}**" if failed else "0") if _is_number(failed) else "—")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Latencies in ms. TTFT: time to first token; TPOT: time per output token after the first, "
            "(E2E − TTFT) / (output tokens − 1); ITL: the gaps between streamed tokens; E2E: the whole request. "
            "In flight: the mean number of requests between sent and answered."]
    out += _serving_errors(points)
    rows = [{"arrivals": _serving_rate_label(p)} for p in points]
    for row, p in zip(rows, points):  # NaN (an empty sample) shown as a dash
        row.update({k: "—" if isinstance(v, float) and not math.isfinite(v) else v
                    for k, v in _flatten(p).items() if k not in ("request_rate", "max_concurrency")})
    return out + ["", '??? note "Every metric of every point"', ""] + _indent(_rows_table(rows)) + [""]


def _serving_errors(runs: list[dict]) -> list[str]:
    """The errors the runs report for their failed requests, each kind once, or nothing."""
    errors = list(dict.fromkeys(str(e) for r in runs for e in (r.get("errors") if isinstance(r.get("errors"), list) else [])))
    if not errors:
        return []
    shown = "; ".join("`" + " ".join(e.replace("`", "'").split()) + "`" for e in errors)
    return ["", f"Errors of the failed requests: {shown}."]


def _serving_comparison_table(spec: ServingComparison, comp: dict) -> list[str]:
    """A row per metric of ``spec.rows`` (then any other ratio of the file) that a run has: the
    off run, each setting with the feature on, and each one's ratio to off (in bold for the
    headline ratios); then the cached prompt tokens, requests in flight and failed requests."""
    off, settings = comp["off"], _serving_settings(spec, comp)
    runs = [off, *(s.metrics for s in settings)]
    given = [k for s in settings for k in s.ratios if _serving_key(k) is not None]
    keys = list(dict.fromkeys([*spec.rows, *given]))
    ratio_heads = ["on against off"] if len(settings) == 1 else [f"{s.label} against {spec.off}" for s in settings]
    out = ["| | " + " | ".join(_md_cell(label) for label in [spec.off, *(s.label for s in settings), *ratio_heads]) + " |",
           "|---|" + "---:|" * (len(runs) + len(settings))]
    blank = " |" * len(settings)
    for key in keys:
        values = [_serving_value(run, key) for run in runs]
        if all(v is None for v in values):
            continue
        unit = " (ms)" if _serving_lower_is_better(key) else ""
        cells = [_number(v) if v is not None else "—" for v in values]
        cells += [_serving_ratio_text(key, _serving_ratio(s, off, key), bold=key in spec.headline) for s in settings]
        out.append(f"| {_md_cell(_serving_label(key))}{unit} | " + " | ".join(cells) + " |")
    if any(_finite(r.get("cached_tokens")) for r in runs):  # some prompt tokens came from a cache
        out.append("| cached prompt tokens | " + " | ".join(_serving_cached(r) or "—" for r in runs) + " |" + blank)
    concurrency = [_finite(r.get("concurrency")) for r in runs]
    if any(c is not None for c in concurrency):
        out.append("| in flight (mean) | " + " | ".join(_number(c) if c is not None else "—" for c in concurrency) + " |" + blank)
    failed = [r.get("failed") for r in runs]
    if any(_is_number(f) for f in failed):
        out.append("| failed requests | " + " | ".join(_fmt(f) if _is_number(f) else "—" for f in failed) + " |" + blank)
    return out + _serving_errors(runs)


def _serving_cached(run: dict) -> str | None:
    """``491,520 (88%)``: the prompt tokens the server answered from its cache, and their share."""
    cached, total = run.get("cached_tokens"), run.get("total_input_tokens")
    if not _is_number(cached):
        return None
    share = f" ({cached / total:.0%})" if _is_number(total) and total > 0 else ""
    return f"{int(cached):,}{share}"


def _serving_headline(data: dict) -> list[str]:
    """The setup on one line (model, server, weights); on the next, the highest output
    throughput of the curve and each comparison's on/off ratios."""
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    parts += _setup_parts(config)
    if config.get("base_url"):
        parts.append(f"the server at `{_md_cell(str(config['base_url']))}` (the hardware above is the client's)")
    elif "base_url" in config:
        args = config.get("server_args")
        args = " ".join(str(a) for a in args) if isinstance(args, list) else ""
        parts.append("a minisgl server started by the run" + (f" with `{_md_cell(args)}`" if args else ""))
    if config.get("dummy_weights"):
        parts.append("random weights")
    if _is_number(config.get("warmup_requests")) and config["warmup_requests"] > 0:
        parts.append(f"{config['warmup_requests']} uncounted warm-up requests before each run")
    out = [" · ".join(parts), ""] if parts else []
    lines = []
    points = _serving_points(data)
    if points is not None:
        best = max(points, key=lambda p: p["output_throughput"])
        lines.append(f"Highest output throughput **{_number(best['output_throughput'], 'tok/s')}** "
                     f"({_serving_rate_label(best)}).")
    for spec, comp in _serving_comparisons(data):
        settings = _serving_settings(spec, comp)
        for setting in settings:
            keys = [k for k in setting.ratios if _serving_key(k) is not None] or list(spec.headline)
            ratios = [(k, _serving_ratio(setting, comp["off"], k)) for k in keys]
            shown = [f"{_serving_label(k)} {_serving_ratio_text(k, r, bold=k in spec.headline)}"
                     for k, r in ratios if r is not None]
            which = " on against off" if len(settings) == 1 else f", {setting.label} against {spec.off}"
            if shown:
                lines.append(f"{spec.feature}{which}: " + ", ".join(shown) + ".")
    return out + ([" ".join(lines), ""] if lines else [])
