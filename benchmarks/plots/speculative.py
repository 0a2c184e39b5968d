"""``speculative`` results (lesson 12's speculative decoding, ``python -m benchmarks speculative``):
tokens per decode step against ``k`` for each proposer, the wall-clock speed-up at batch size 1,
the verify forward's cost against a decode forward (and the speed-up it projects at the measured
acceptance), and throughput with and without speculation against batch size.

:func:`draw_speculative` draws the chart (a matplotlib figure, one panel per part the file has),
:func:`speculative_section` writes the Benchmarks page section (Markdown), and
:func:`speculative_comparison` the page's table of every speculative file, one row per file and
proposer (the CPU and the GPU files side by side)."""

from __future__ import annotations

import posixpath
from typing import Any

from .common import (
    MARKERS,
    PLOT_WIDTH_IN,
    BenchmarkResult,
    _config,
    _file_link,
    _is_number,
    _md_cell,
    _model_and_hardware,
    _number,
    _on_hardware,
    _plot_markdown,
    _results_block,
)

LESSON = "[lesson 12](../lessons/l12/README.md)"
WORKLOAD_STYLES = {"all": "-", "chat": "--", "prose": ":"}
ENGINE_NAMES = {"off": "without speculation", "off_eager": "without speculation, CUDA graphs off",
                "ngram": "n-gram proposer", "draft": "draft model"}


def _positive(v: Any) -> bool:
    return _is_number(v) and v > 0


def _results(data: dict) -> dict:
    results = data.get("results")
    return results if isinstance(results, dict) else {}


def _spread(v: Any) -> dict[str, float] | None:
    """A ``{median, min, max}`` object of positive numbers, or None."""
    if isinstance(v, dict) and all(_positive(v.get(k)) for k in ("median", "min", "max")):
        return v
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _ratio(s: dict[str, float], bold: bool = False) -> str:
    text = f"{_number(s['median'])}×"
    return (f"**{text}**" if bold else text) + f" ({_number(s['min'])}–{_number(s['max'])})"


# --- what the file holds --------------------------------------------------------------------------

def _acceptance(data: dict) -> list[dict[str, Any]] | None:
    """``results.acceptance.rows`` with a proposer, a positive ``k`` and ``tokens_per_step``."""
    part = _results(data).get("acceptance")
    rows = part.get("rows") if isinstance(part, dict) else None
    if not isinstance(rows, list):
        return None
    good = [r for r in rows if isinstance(r, dict) and isinstance(r.get("proposer"), str)
            and _positive(r.get("k")) and _positive(r.get("tokens_per_step")) and isinstance(r.get("workload"), str)]
    return good or None


def _speedup(data: dict) -> dict[str, dict[str, Any]] | None:
    """``results.speedup.engines`` that have a ``speedup_vs_off`` spread (the speculating ones)."""
    part = _results(data).get("speedup")
    engines = part.get("engines") if isinstance(part, dict) else None
    if not isinstance(engines, dict):
        return None
    good = {k: e for k, e in engines.items() if isinstance(e, dict) and _spread(e.get("speedup_vs_off"))}
    return good or None


def _shape_rows(data: dict, part_name: str, keep, key) -> dict[str, dict[str, Any]] | None:
    """``results.<part_name>.shapes``, each shape with its rows that ``keep`` accepts, sorted by
    ``key``; shapes left with no rows are dropped (None if none is left)."""
    part = _results(data).get(part_name)
    shapes = part.get("shapes") if isinstance(part, dict) else None
    if not isinstance(shapes, dict):
        return None
    out = {}
    for name, entry in shapes.items():
        rows = entry.get("rows") if isinstance(entry, dict) else None
        if not isinstance(rows, list):
            continue
        good = [r for r in rows if isinstance(r, dict) and keep(r)]
        if good:
            out[name] = {**entry, "rows": sorted(good, key=key)}
    return out or None


def _verify(data: dict) -> dict[str, dict[str, Any]] | None:
    """``results.verify_cost.shapes`` with rows of ``batch_size``, ``k``, ``verify_ms`` and
    ``decode_eager_ms``; each shape's rows sorted by batch size and ``k``."""
    return _shape_rows(data, "verify_cost",
                       lambda r: all(_positive(r.get(k)) for k in ("batch_size", "k", "verify_ms", "decode_eager_ms")),
                       lambda r: (r["batch_size"], r["k"]))


def _throughput(data: dict) -> dict[str, dict[str, Any]] | None:
    """``results.throughput.shapes`` with rows of ``batch_size`` and an ``off`` throughput spread."""
    return _shape_rows(data, "throughput",
                       lambda r: (_positive(r.get("batch_size")) and isinstance(r.get("off"), dict)
                                  and _spread(r["off"].get("output_tok_s"))),
                       lambda r: r["batch_size"])


def _proposers(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["proposer"] for r in rows))


def _spec_keys(row: dict[str, Any]) -> list[str]:
    """The speculating engines of a throughput row (those with a speed-up spread)."""
    return [k for k, v in row.items() if isinstance(v, dict) and _spread(v.get("speedup_vs_off"))]


def _colors(theme: dict[str, Any]) -> dict[str, str]:
    series = theme["series"]
    return {"ngram": series[0], "draft": series[1], "off_eager": series[2]}


# --- the chart ------------------------------------------------------------------------------------

def draw_speculative(data: dict, theme: dict[str, Any]):
    """One panel per part in the file: tokens per decode step against k (a line per proposer,
    solid for all prompts, dashed for chat, dotted for prose); the batch-size-1 speed-up
    (median bars, min–max whiskers); the verify forward's cost over a decode forward against k
    at the smallest batch size (a line per model, solid over the eager decode, dashed over the
    graphed one, dotted for the draft model's decode forward); throughput with speculation over
    without against batch size. None if the
    file has none of them."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    panels = []
    if _acceptance(data):
        panels.append(_draw_acceptance)
    if _speedup(data):
        panels.append(_draw_speedup)
    if _verify(data):
        panels.append(_draw_verify)
    if _throughput(data):
        panels.append(_draw_throughput)
    if not panels:
        return None
    rows = -(-len(panels) // 2)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 3.9 * rows), layout="constrained")
    axes = fig.subplots(rows, 2, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        panel(ax, data, theme)
        if ax.get_xscale() == "log":
            ax.xaxis.set_minor_locator(NullLocator())
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    model = _config(data).get("model")
    fig.suptitle(f"Speculative decoding{f' ({model})' if model else ''}{_on_hardware(data)}", x=0.01, ha="left")
    return fig


def _unit_line(ax, theme: dict[str, Any], label: str | None = None) -> None:
    """The line at 1 (no gain), labelled just under it at the right end."""
    ax.axhline(1.0, color=theme["fg"], linestyle=":", linewidth=1.1)
    if label:
        ax.annotate(label, (1.0, 1.0), xycoords=("axes fraction", "data"), xytext=(-4, -11), textcoords="offset points",
                    ha="right", fontsize=8, color=theme["muted"])


def _draw_acceptance(ax, data: dict, theme: dict[str, Any]) -> None:
    rows = _acceptance(data) or []
    colors = _colors(theme)
    ks = sorted({r["k"] for r in rows})
    for i, proposer in enumerate(_proposers(rows)):
        color = colors.get(proposer, theme["series"][(i + 3) % len(theme["series"])])
        for workload, style in WORKLOAD_STYLES.items():
            points = sorted((r["k"], r["tokens_per_step"]) for r in rows
                            if r["proposer"] == proposer and r["workload"] == workload)
            if not points:
                continue
            main = workload == "all"
            ax.plot([k for k, _ in points], [t for _, t in points], color=color, linestyle=style,
                    marker=MARKERS[i] if main else None, markersize=4.5, linewidth=1.8 if main else 1.1,
                    label=f"{ENGINE_NAMES.get(proposer, proposer)}" + ("" if main else f", {workload}"))
    _unit_line(ax, theme, "one token per step (no speculation)")
    top = max(r["tokens_per_step"] for r in rows)
    ax.set_ylim(0.9, max(1.3, top + 0.1 * (top - 0.9) + 0.05))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k, most drafts per step")
    ax.set_ylabel("tokens per decode step")
    ax.set_title("Tokens per decode step against k", loc="left")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))


def _draw_speedup(ax, data: dict, theme: dict[str, Any]) -> None:
    engines = _speedup(data) or {}
    colors = _colors(theme)
    bars = []  # (label, spread, color)
    for key, entry in engines.items():
        if key == "off_eager":
            bars.append(("without\nspeculation,\ngraphs off", entry["speedup_vs_off"], colors["off_eager"]))
            continue
        name = ENGINE_NAMES.get(key, key)
        bars.append((name.replace(" ", "\n", 1), entry["speedup_vs_off"], colors.get(key, theme["accent"])))
        if _spread(entry.get("speedup_vs_off_eager")):  # short labels: five bars share the panel's width
            bars.append((f"{name.split()[0]}\nover\ngraphs off", entry["speedup_vs_off_eager"],
                         colors.get(key, theme["accent"])))
    xs = range(len(bars))
    medians = [s["median"] for _, s, _ in bars]
    low = [s["median"] - s["min"] for _, s, _ in bars]
    high = [s["max"] - s["median"] for _, s, _ in bars]
    ax.bar(xs, medians, color=[c for _, _, c in bars], width=0.55, yerr=[low, high], capsize=4,
           error_kw={"ecolor": theme["fg"], "elinewidth": 1.0})
    ax.set_xlim(-0.6, max(len(bars), 2) - 0.4)
    for x, (_, s, _) in zip(xs, bars):
        ax.annotate(f"{_number(s['median'])}×", (x, s["max"]), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8.5, fontweight="bold")
    _unit_line(ax, theme)
    few = len(bars) <= 3  # room for each label on one line
    ax.set_xticks(list(xs), [label.replace("\n", " ") if few else label for label, _, _ in bars],
                  fontsize=8.5 if few else 8)
    ax.set_ylim(0, max([1.2] + [s["max"] * 1.15 for _, s, _ in bars]))
    part = _results(data)["speedup"]
    k = part.get("k")
    ax.set_ylabel("wall clock, over without speculation\n(median, min–max; 1 = as fast)")
    ax.set_title(f"Batch size 1{f', k = {k}' if _is_number(k) else ''}", loc="left")


def _draw_verify(ax, data: dict, theme: dict[str, Any]) -> None:
    shapes = _verify(data) or {}
    series = theme["series"]
    ks: set[int] = set()
    used: set[str] = set()  # the line styles drawn: solid (eager), dashed (graphed), dotted (draft)
    for i, (name, entry) in enumerate(shapes.items()):
        first = entry["rows"][0]["batch_size"]
        rows = [r for r in entry["rows"] if r["batch_size"] == first]
        ks |= {r["k"] for r in rows}
        color = series[(i + 2) % len(series)]
        ax.plot([r["k"] for r in rows], [r["verify_ms"] / r["decode_eager_ms"] for r in rows], color=color,
                marker=MARKERS[i % len(MARKERS)], markersize=4, linewidth=1.8, label=f"{name}, over the eager decode")
        used.add("-")
        graphed = [r for r in rows if _positive(r.get("decode_graph_ms"))]
        used |= {"--"} if graphed else set()
        if graphed:
            ax.plot([r["k"] for r in graphed], [r["verify_ms"] / r["decode_graph_ms"] for r in graphed], color=color,
                    linestyle="--", linewidth=1.2, label=f"{name}, over the graphed decode")
        drafts = [r for r in rows if _positive(r.get("draft_decode_ms"))]
        used |= {":"} if drafts else set()
        if drafts:
            ax.plot([r["k"] for r in drafts], [r["draft_decode_ms"] / r["decode_eager_ms"] for r in drafts], color=color,
                    linestyle=":", linewidth=1.2, label=f"{name}: its draft model's decode forward")
    _unit_line(ax, theme, "a decode step's cost")
    ax.set_xticks(sorted(ks))
    ax.set_ylim(0, None)
    ax.set_xlabel("k, draft tokens in the row (1 + k positions)")
    ax.set_ylabel("verify forward / decode forward")
    ax.set_title("What a verify step costs (one row)", loc="left")
    if len(shapes) == 1:
        ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1, 0.08))
        return
    # several models: a colour per model and a line style per ratio, under the panel (the ratios
    # of a large model and a small one spread over the whole height)
    from matplotlib.lines import Line2D

    styles = [("-", "over the eager decode"), ("--", "over the graphed decode"),
              (":", "the draft model's decode forward")]
    handles = [Line2D([], [], color=series[(i + 2) % len(series)], marker=MARKERS[i % len(MARKERS)], markersize=4,
                      linewidth=1.8, label=name) for i, name in enumerate(shapes)]
    handles += [Line2D([], [], color=theme["fg"], linestyle=style, linewidth=1.2, label=label)
                for style, label in styles if style in used]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)


def _draw_throughput(ax, data: dict, theme: dict[str, Any]) -> None:
    shapes = _throughput(data) or {}
    colors = _colors(theme)
    bs_all: set[int] = set()
    for i, (name, entry) in enumerate(shapes.items()):
        style = ("-", "--", ":")[i % 3]
        keys = list(dict.fromkeys(k for r in entry["rows"] for k in _spec_keys(r)))
        for j, key in enumerate(keys):
            points = [(r["batch_size"], r[key]["speedup_vs_off"]) for r in entry["rows"] if key in _spec_keys(r)]
            bs = [b for b, _ in points]
            bs_all |= set(bs)
            color = colors.get(key, theme["series"][(j + 3) % len(theme["series"])])
            ax.plot(bs, [s["median"] for _, s in points], color=color, linestyle=style, marker=MARKERS[j % len(MARKERS)],
                    markersize=4, linewidth=1.8, label=f"{ENGINE_NAMES.get(key, key)}, {name}")
            ax.fill_between(bs, [s["min"] for _, s in points], [s["max"] for _, s in points], color=color, alpha=0.15,
                            linewidth=0)
    _unit_line(ax, theme, "as fast as without speculation")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(bs_all), [str(b) for b in sorted(bs_all)])
    ax.set_xlabel("batch size (most requests in flight)")
    ax.set_ylabel("throughput, with over without")
    ax.set_title("Where it stops paying", loc="left")
    ax.legend(fontsize=8, loc="best")


# --- the page section -----------------------------------------------------------------------------

def speculative_section(res: BenchmarkResult) -> list[str] | None:
    """The workload, the chart, then a table per part the file has; None when it has none."""
    data = res.data
    acceptance, speedup, verify, throughput = _acceptance(data), _speedup(data), _verify(data), _throughput(data)
    if not (acceptance or speedup or verify or throughput):
        return None
    out = _headline(data)
    out += _plot_markdown(res, "tokens per decode step against k for each proposer, the batch-size-1 speed-up, "
                               "the verify forward's cost over a decode forward, and throughput with speculation "
                               "over without against batch size")
    if acceptance:
        out += _acceptance_table(data, acceptance)
    if speedup:
        out += _speedup_table(data, speedup)
    if verify:
        out += _verify_tables(data, verify)
    if throughput:
        out += _throughput_tables(throughput)
    skipped = _results(data).get("skipped_proposers")
    if isinstance(skipped, dict) and skipped:
        out += ["Not measured in this run: " + "; ".join(f"`{_md_cell(str(p))}` ({_md_cell(str(why))})"
                                                        for p, why in skipped.items()) + ".", ""]
    shown = {"acceptance"} if acceptance else set()
    shown |= {"speedup"} if speedup else set()
    shown |= {"verify_cost"} if verify else set()
    shown |= {"throughput"} if throughput else set()
    shown |= {"skipped_proposers"}
    rest = {k: v for k, v in _results(data).items() if k not in shown}
    return out + (_results_block(rest) if rest else [])


def _headline(data: dict) -> list[str]:
    config = _config(data)
    parts = [f"**{_md_cell(str(config['model']))}**"] if config.get("model") else []
    parts += [_md_cell(str(config[k])) for k in ("device", "dtype") if config.get(k)]
    if config.get("greedy"):
        parts.append("greedy")
    workloads = config.get("workloads")
    if isinstance(workloads, dict) and workloads:
        parts.append("prompts: " + "; ".join(f"{_md_cell(str(k))}, {_md_cell(str(v))}" for k, v in workloads.items()))
    text = " · ".join(parts)
    if not text:
        return []
    text += f". Measured by `python -m benchmarks speculative` ({LESSON})."
    if config.get("plain_engine"):  # what "without speculation" means in this run
        text += f" The engine without speculation: {_md_cell(str(config['plain_engine']))}."
    return [text, ""]


def _acceptance_table(data: dict, rows: list[dict[str, Any]]) -> list[str]:
    part = _results(data)["acceptance"]
    workloads = [w for w in ("chat", "prose") if any(r["workload"] == w for r in rows)]
    head = ["proposer", "k", *(f"tokens per step, {w}" for w in workloads), "tokens per step, all",
            "drafts accepted, all", "outputs identical to the plain engine's"]
    out = ["**Tokens per decode step** (accepted drafts plus the target's own token, a step without drafts "
           "adding one; greedy" + (f", at most {part['max_tokens']} new tokens" if _is_number(part.get("max_tokens")) else "")
           + "):", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    by = {(r["proposer"], r["k"], r["workload"]): r for r in rows}
    for proposer in _proposers(rows):
        for k in sorted({r["k"] for r in rows if r["proposer"] == proposer}):
            total = by.get((proposer, k, "all"))
            cells = [f"`{_md_cell(proposer)}`", str(k)]
            cells += [_number(by[(proposer, k, w)]["tokens_per_step"]) if (proposer, k, w) in by else "—" for w in workloads]
            if total is None:
                cells += ["—", "—", "—"]
            else:
                rate = total.get("acceptance_rate")
                cells.append(f"**{_number(total['tokens_per_step'])}**")
                cells.append(f"{total.get('accepted', '—')} of {total.get('drafted', '—')}"
                             + (f" ({rate:.0%})" if _is_number(rate) else ""))
                same, n = total.get("identical_to_plain"), total.get("requests")
                cells.append(f"{same} of {n}" if _is_number(same) and _is_number(n) else "—")
            out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _speedup_table(data: dict, engines: dict[str, dict[str, Any]]) -> list[str]:
    part = _results(data)["speedup"]
    every = part.get("engines", {})
    eager = any(_spread(e.get("speedup_vs_off_eager")) for e in engines.values())
    head = ["engine", "output tok/s (median)", "speed-up over the plain engine (min–max)"]
    head += ["over the plain engine with graphs off"] if eager else []
    head += ["tokens per step", "outputs identical"]
    what = (f"{part['prompts']} prompts one at a time" if _is_number(part.get("prompts")) else "prompts one at a time")
    what += f", k = {part['k']}" if _is_number(part.get("k")) else ""
    what += f", {_plural(part['repeats'], 'interleaved repeat')}" if _is_number(part.get("repeats")) else ""
    out = [f"**Batch size 1, wall clock** ({what}; a repeat's speed-up is the plain engine's time over this one's, "
           "on the same greedy tokens):", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for key, entry in every.items():
        if not isinstance(entry, dict):
            continue
        tok_s = _spread(entry.get("output_tok_s"))
        cells = [_md_cell(ENGINE_NAMES.get(key, key)), _number(tok_s["median"]) if tok_s else "—"]
        s = _spread(entry.get("speedup_vs_off"))
        cells.append(_ratio(s, bold=key != "off_eager") if s else "—")
        if eager:
            s = _spread(entry.get("speedup_vs_off_eager"))
            cells.append(_ratio(s) if s else "—")
        t = entry.get("tokens_per_step")
        cells.append(_number(t) if _positive(t) else "1" if key.startswith("off") else "—")
        same = entry.get("identical_to_off")
        n = part.get("prompts")
        cells.append(f"{same} of {n}" if _is_number(same) and _is_number(n) else "—")
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _verify_tables(data: dict, shapes: dict[str, dict[str, Any]]) -> list[str]:
    part = _results(data)["verify_cost"]
    source = part.get("acceptance_source")
    out = ["**The verify step's cost**: one forward and the read of its tokens, a row of 1 + k new tokens over "
           "a cached context, against the decode forward of one token (median of "
           f"{part.get('reps', '—')} each; eager, as speculation runs; graphed, as the engine without "
           "speculation runs its decode steps)."]
    out += [f"**Projected** speed-up at the acceptance of {_md_cell(str(source))} (workload all): the plain "
            "engine's decode forwards for the same tokens over the measured steps' forwards (a step with d drafts: "
            "the verify forward of 1 + d tokens, plus d of the draft model's decode forwards where they were timed; "
            "the n-gram lookup's host time left out). Forwards only: the scheduler's host time per step is not in it."] \
        if source else []
    out.append("")
    for name, entry in shapes.items():
        projected = {(p["proposer"], p["k"], p["batch_size"]): p for p in entry.get("projected", [])
                     if isinstance(p, dict) and _positive(p.get("speedup_vs_eager_decode"))}
        first = entry["rows"][0]["batch_size"]
        rows = [r for r in entry["rows"] if r["batch_size"] == first]
        graphed = any(_positive(r.get("decode_graph_ms")) for r in rows)
        context = entry.get("context")
        line = f"*{_md_cell(name)}*" + (" (random weights)" if entry.get("dummy_weights") else "")
        line += f", {first} row{'s' * (first != 1)}" + (f", context {context}" if _is_number(context) else "")
        line += f": decode forward {_number(rows[0]['decode_eager_ms'], 'ms')} eager"
        line += f", {_number(rows[0]['decode_graph_ms'], 'ms')} graphed" if graphed else ""
        draft_ms = rows[0].get("draft_decode_ms")
        line += f"; the draft model's decode forward {_number(draft_ms, 'ms')} (eager)" if _positive(draft_ms) else ""
        head = ["k", "verify forward", "× eager decode"] + (["× graphed decode"] if graphed else [])
        proposers = list(dict.fromkeys(p for p, k, b in projected if b == first))
        for p in proposers:
            head += [f"projected, `{p}` at k"] + (["(over graphed)"] if graphed else [])
        out += [line, "", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for r in rows:
            cells = [str(r["k"]), _number(r["verify_ms"], "ms"), f"{_number(r['verify_ms'] / r['decode_eager_ms'])}×"]
            if graphed:
                cells.append(f"{_number(r['verify_ms'] / r['decode_graph_ms'])}×" if _positive(r.get("decode_graph_ms"))
                             else "—")
            for p in proposers:
                proj = projected.get((p, r["k"], first))
                cells.append(f"{_number(proj['speedup_vs_eager_decode'])}×" if proj else "—")
                if graphed:
                    g = proj.get("speedup_vs_graphed_decode") if proj else None
                    cells.append(f"{_number(g)}×" if _positive(g) else "—")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        ceilings = list(dict.fromkeys(p for p, k, b in projected if b == first
                                      and "ceiling" in str(projected[(p, k, b)].get("proposer_cost", ""))))
        if ceilings:
            out += [" ".join(f"`{_md_cell(p)}` on this model: the draft model's forwards were not timed, so its "
                             "projection leaves them out (a ceiling)." for p in ceilings), ""]
        batch_sizes = sorted({r["batch_size"] for r in entry["rows"]})
        if len(batch_sizes) > 1:
            out += _verify_by_batch(entry, batch_sizes, projected)
    return out


def _verify_by_batch(entry: dict[str, Any], batch_sizes: list[int], projected: dict) -> list[str]:
    """Per batch size: the decode forwards, and the verify forward's cost at each k measured
    (over the graphed decode where there is one)."""
    ks = sorted({r["k"] for r in entry["rows"]})
    by = {(r["batch_size"], r["k"]): r for r in entry["rows"]}
    graphed = any(_positive(r.get("decode_graph_ms")) for r in entry["rows"])
    over = "graphed" if graphed else "eager"
    head = ["batch size", "decode, eager"] + (["decode, graphed"] if graphed else [])
    head += [f"k = {k}" for k in ks]
    ngram_k = sorted({k for p, k, b in projected if p == "ngram"})
    head += [f"projected, `ngram` k = {k}" for k in ngram_k]
    out = [f"Verify forward over the {over} decode forward, per batch size (every row 1 + k tokens):", "",
           "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for b in batch_sizes:
        any_row = next(by[(b, k)] for k in ks if (b, k) in by)
        cells = [str(b), _number(any_row["decode_eager_ms"], "ms")]
        if graphed:
            cells.append(_number(any_row["decode_graph_ms"], "ms") if _positive(any_row.get("decode_graph_ms")) else "—")
        for k in ks:
            r = by.get((b, k))
            base = r.get("decode_graph_ms") if r and graphed else r.get("decode_eager_ms") if r else None
            cells.append(f"{_number(r['verify_ms'] / base)}×" if r and _positive(base) else "—")
        for k in ngram_k:
            p = projected.get(("ngram", k, b))
            v = p.get("speedup_vs_graphed_decode" if graphed else "speedup_vs_eager_decode") if p else None
            cells.append(f"{_number(v)}×" if _positive(v) else "—")
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _accepted_range(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """``; drafts accepted: n-gram proposer 62–67%``: each proposer's acceptance over the rows."""
    parts = []
    for key in keys:
        rates = [r[key]["acceptance_rate"] for r in rows if isinstance(r.get(key), dict)
                 and _is_number(r[key].get("acceptance_rate"))]
        if rates:
            lo, hi = f"{min(rates):.0%}", f"{max(rates):.0%}"
            parts.append(f"{ENGINE_NAMES.get(key, key)} {lo if lo == hi else f'{lo[:-1]}–{hi}'}")
    return "; drafts accepted: " + ", ".join(parts) if parts else ""


def _throughput_tables(shapes: dict[str, dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for name, entry in shapes.items():
        keys = list(dict.fromkeys(k for r in entry["rows"] for k in _spec_keys(r)))
        what = [f"prompts: {_md_cell(str(entry['prompt']))}"] if entry.get("prompt") else []
        what += [f"at most {entry['max_tokens']} new tokens"] if _is_number(entry.get("max_tokens")) else []
        what += [f"k = {entry['k']}"] if _is_number(entry.get("k")) else []
        what += [_plural(entry["repeats"], "interleaved repeat")] if _is_number(entry.get("repeats")) else []
        label = f"*{_md_cell(name)}*" + (" (random weights: its greedy text repeats itself, so prompt lookup finds more "
                                          "to draft than in real text: a best case for the n-gram proposer"
                                          + _accepted_range(entry["rows"], keys) + ")" if entry.get("dummy_weights") else "")
        requests = any(_is_number(r.get("requests")) for r in entry["rows"])
        head = ["batch size"] + (["requests"] if requests else []) + ["output tok/s, without"]
        for key in keys:
            head += [f"{ENGINE_NAMES.get(key, key)}", "speed-up (min–max)", "tokens per step"]
        out += [f"**Throughput against batch size**, {label}: " + ", ".join(what + ["at most *batch size* in flight "
                "(median output tok/s)"]) + ":", "", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for r in entry["rows"]:
            cells = [str(r["batch_size"])] + ([_md_cell(str(r.get("requests", "—")))] if requests else [])
            cells.append(_number(r["off"]["output_tok_s"]["median"]))
            for key in keys:
                v = r.get(key)
                if not isinstance(v, dict) or not _spread(v.get("speedup_vs_off")):
                    cells += ["—", "—", "—"]
                    continue
                tok_s = _spread(v.get("output_tok_s"))
                s = v["speedup_vs_off"]
                cells += [_number(tok_s["median"]) if tok_s else "—", _ratio(s, bold=s["median"] >= 1),
                          _number(v["tokens_per_step"]) if _positive(v.get("tokens_per_step")) else "—"]
            out.append("| " + " | ".join(cells) + " |")
        for key in keys:
            paying = [r["batch_size"] for r in entry["rows"] if key in _spec_keys(r) and r[key]["speedup_vs_off"]["median"] > 1]
            last = max(paying) if paying else None
            out += ["", f"{ENGINE_NAMES.get(key, key).capitalize()}: "
                    + (f"faster than without speculation up to batch size {last} (median)." if last
                       else "never faster than without speculation here.")]
        out.append("")
    return out


# --- the page's table of every speculative file -----------------------------------------------------

def speculative_comparison(results: list[BenchmarkResult]) -> str:
    """One row per speculative file and proposer: tokens per decode step at the speed-up's k, the
    batch-size-1 speed-up and the throughput speed-up at the smallest and largest batch sizes of
    the file's first throughput model."""
    rows = []
    for res in results:
        if res.name != "speculative":
            continue
        data = res.data
        acceptance, speedup, throughput = _acceptance(data) or [], _speedup(data) or {}, _throughput(data) or {}
        part = _results(data).get("speedup")
        k = part.get("k") if isinstance(part, dict) else _config(data).get("k")
        proposers = list(dict.fromkeys([*_proposers(acceptance), *(p for p in speedup if not p.startswith("off"))]))
        first = next(iter(throughput.values()), None)
        for proposer in proposers:
            acc = next((r for r in acceptance if r["proposer"] == proposer and r["k"] == k and r["workload"] == "all"), None)
            s = _spread(speedup.get(proposer, {}).get("speedup_vs_off"))
            cells = [_model_and_hardware(data), f"`{_md_cell(proposer)}`", str(k) if _is_number(k) else "—",
                     _number(acc["tokens_per_step"]) if acc else "—", _ratio(s, bold=True) if s else "—"]
            for pick in (0, -1):
                row = first["rows"][pick] if first else None
                v = row.get(proposer) if row else None
                t = _spread(v.get("speedup_vs_off")) if isinstance(v, dict) else None
                cells.append(f"{_number(t['median'])}× at {row['batch_size']}" if t else "—")
            cells.append(_file_link(res.rel, posixpath.basename(res.rel)))
            rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return "_No speculative results committed yet._\n"
    head = ["| model, hardware | proposer | k | tokens per decode step | speed-up at batch size 1 (min–max) "
            "| throughput speed-up, smallest batch | largest batch | file |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    return "\n".join(head + rows) + "\n"
