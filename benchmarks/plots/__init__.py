"""Benchmark charts and tables, drawn once for the notebooks and for the site.

One module per kind of results file (``benchmarks/results/*.json``, kind = its ``benchmark``
key), each with a drawing function (a matplotlib figure) and a section of the site's
Benchmarks page (Markdown):

=================  ====================  =====================
kind               chart                 page section
=================  ====================  =====================
attention_decode   :func:`draw_attention`  :func:`attention_section`
offline            :func:`draw_offline`    :func:`offline_section`
radix              :func:`draw_radix`      :func:`radix_section`
chunked            :func:`draw_chunked`    :func:`chunked_section`
overlap            :func:`draw_overlap`    :func:`overlap_section`
host               :func:`draw_host`       :func:`host_section`
graphs             :func:`draw_graphs`     :func:`graphs_section`
tp                 :func:`draw_tp`         :func:`tp_section`
serving            :func:`draw_serving`    :func:`serving_section`
steps              :func:`draw_steps`      :func:`steps_section`
moe                :func:`draw_moe`        :func:`moe_section`
speculative        :func:`draw_speculative`  :func:`speculative_section`
=================  ====================  =====================

A notebook shows a chart with ``plots.show("chunked_qwen3-0.6b_gpu.json")``; the site's hook
writes every chart as SVG (:func:`render_svgs`, a light and a dark variant) and fills the
Benchmarks page with :func:`results_markdown`. A file of another kind, or one whose numbers do
not have the expected shape, gets generic tables and no chart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .attention import attention_section, draw_attention
from .chunked import chunked_comparison, chunked_section, draw_chunked
from .common import (
    PLOT_DIR,
    THEMES,
    BenchmarkResult,
    _benchmark_title,
    _generic_tables,
    _md_cell,
    _provenance,
    load_results,
    rc,
    render_svgs,
)
from .graphs import draw_graphs, graphs_section
from .host import draw_host, host_section
from .moe import draw_moe, moe_section
from .offline import draw_offline, offline_section
from .overlap import draw_overlap, overlap_section
from .radix import draw_radix, radix_comparison, radix_section
from .serving import draw_serving, serving_section
from .speculative import draw_speculative, speculative_comparison, speculative_section
from .steps import draw_steps, steps_section
from .tp import draw_tp, tp_section

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"

# kind -> (draw(data, theme) -> Figure | None, page section(result) -> Markdown lines | None)
KINDS: dict[str, tuple[Callable, Callable]] = {
    "attention_decode": (draw_attention, attention_section),
    "offline": (draw_offline, offline_section),
    "radix": (draw_radix, radix_section),
    "chunked": (draw_chunked, chunked_section),
    "overlap": (draw_overlap, overlap_section),
    "host": (draw_host, host_section),
    "graphs": (draw_graphs, graphs_section),
    "tp": (draw_tp, tp_section),
    "serving": (draw_serving, serving_section),
    "steps": (draw_steps, steps_section),
    "moe": (draw_moe, moe_section),
    "speculative": (draw_speculative, speculative_section),
}


def load(name: str | Path) -> dict[str, Any]:
    """A results file, by its name in ``benchmarks/results/`` or by its path."""
    path = Path(name)
    if not path.is_file():
        path = RESULTS_DIR / name
    return json.loads(path.read_text(encoding="utf-8"))


def figure(data: dict[str, Any], theme: str = "light"):
    """The chart of a results file's ``data`` in one of :data:`THEMES`, or None when its kind has
    no chart or its numbers are not there."""
    import matplotlib

    draw = KINDS.get(str(data.get("benchmark")), (None, None))[0]
    if draw is None:
        return None
    with matplotlib.rc_context(rc(THEMES[theme])):
        return draw(data, THEMES[theme])


def show(name: str | Path, theme: str = "light"):
    """The chart of the results file ``name`` (a notebook cell ending with it draws it)."""
    return figure(load(name), theme)


def svgs(result: BenchmarkResult) -> dict[str, str]:
    """``{theme: SVG text}`` of a result's chart, or ``{}`` when it has none."""
    draw = KINDS.get(result.name, (None, None))[0]
    return render_svgs(draw, result) if draw is not None else {}


def results_markdown(results: list[BenchmarkResult]) -> str:
    """The "Results" section of the Benchmarks page: one subsection per results file, its chart
    named by ``result.plots`` (``{theme: site path}``, filled by whoever wrote the SVGs)."""
    if not results:
        return (
            '!!! info "No results yet"\n'
            "    `benchmarks/results/` holds no result files yet, so there is nothing to show. "
            "Numbers appear here when a benchmark run commits its JSON file; this page never "
            "shows a number that is not in such a file.\n"
        )
    out: list[str] = []
    for res in results:
        out.append(f"### {_md_cell(_benchmark_title(res))}\n")
        out += _provenance(res)
        section = KINDS.get(res.name, (None, None))[1]
        body = section(res) if section else None
        out += body if body is not None else _generic_tables(res.data)
        out.append("")
    return "\n".join(out) + "\n"



__all__ = [
    "KINDS", "PLOT_DIR", "RESULTS_DIR", "THEMES", "BenchmarkResult", "chunked_comparison", "figure", "load",
    "load_results", "radix_comparison", "rc", "render_svgs", "results_markdown", "show", "svgs",
    "draw_attention", "draw_offline", "draw_radix", "draw_chunked", "draw_overlap", "draw_host", "draw_graphs",
    "draw_tp", "draw_serving", "draw_steps", "draw_moe", "attention_section", "offline_section", "radix_section",
    "chunked_section", "overlap_section", "host_section", "graphs_section", "tp_section", "serving_section",
    "steps_section", "moe_section", "draw_speculative", "speculative_section", "speculative_comparison",
]
