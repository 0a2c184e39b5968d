"""What every kind of benchmark results shares: loading the files, the generic tables, number
formatting, the two colour themes of the charts and their rendering to SVG."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.benchmarks")  # under "mkdocs": a warning fails a strict site build


def _md_cell(text: str) -> str:
    """``text`` made safe for a Markdown table cell."""
    return text.replace("|", "\\|")


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(_fmt(x) for x in v)
    if isinstance(v, (dict, list)):
        text = json.dumps(v, separators=(",", ":"))
        if len(text) > LONG_VALUE_CHARS:  # e.g. a per-step trace: summarised, the file has it all
            return f"{len(v)} entries (in the results file)"
        return "`" + text + "`"
    return _md_cell(str(v))


LONG_VALUE_CHARS = 200  # nested values longer than this are not spelled out in generic tables


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def _kv_table(d: dict, head: tuple[str, str] = ("", "")) -> list[str]:
    flat = _flatten(d)
    out = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    out += [f"| {_md_cell(k)} | {_fmt(v)} |" for k, v in flat.items()]
    return out


def _rows_table(rows: list[dict]) -> list[str]:
    flat_rows = [_flatten(r) for r in rows]
    cols: list[str] = []
    for r in flat_rows:
        cols += [c for c in r if c not in cols]
    out = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in flat_rows]
    return out


def _is_rows(v: Any) -> bool:
    """A list of objects, or an object of objects: one table row per entry."""
    if isinstance(v, list):
        return bool(v) and all(isinstance(r, dict) for r in v)
    return isinstance(v, dict) and bool(v) and all(isinstance(r, dict) for r in v.values())


def _is_record(v: Any) -> bool:
    """An object of plain values (one row of a table)."""
    return isinstance(v, dict) and bool(v) and not any(isinstance(x, (dict, list)) and not _is_scalar_list(x) for x in v.values())


def _is_scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)


def _results_block(results: Any) -> list[str]:
    """Tables for a ``results`` value.

    A list of objects or an object of objects is one table, a row per entry; in a mixed
    object, the entries that are objects become rows of one table, plain values a metric/value
    table, and nested row sets their own tables.
    """
    if _is_rows(results) and (isinstance(results, list) or all(_is_record(v) for v in results.values())):
        rows = results if isinstance(results, list) else [{"case": k, **v} for k, v in results.items()]
        return _rows_table(rows)
    if not isinstance(results, dict):
        return [f"`{json.dumps(results)}`"]
    records = {k: v for k, v in results.items() if _is_record(v)}
    row_sets = {k: v for k, v in results.items() if k not in records and _is_rows(v)}
    scalars = {k: v for k, v in results.items() if k not in records and k not in row_sets}
    out: list[str] = []
    if len(records) >= 2:
        out += _rows_table([{"case": k, **v} for k, v in records.items()])
    else:
        scalars = {**records, **scalars}
    if scalars:
        out += ([""] if out else []) + _kv_table(scalars, ("metric", "value"))
    for key, value in row_sets.items():
        out += ["", f"**{_md_cell(str(key))}**", ""] + _results_block(value)
    return out


def _hardware_summary(hw: Any) -> str:
    if not isinstance(hw, dict):
        return _fmt(hw)
    if hw.get("gpu"):
        count = hw.get("gpu_count")
        return f"{hw['gpu']}" + (f" ×{count}" if isinstance(count, int) and count > 1 else "")
    cpu = hw.get("cpu") or "CPU"
    return f"CPU {cpu}" + (f", {hw['cpu_count']} cores" if hw.get("cpu_count") else "")


@dataclass
class BenchmarkResult:
    """One ``benchmarks/results/*.json`` file, and the site paths of the plot drawn from it."""

    rel: str  # path in the repository
    data: dict[str, Any]
    plots: dict[str, str] = field(default_factory=dict)  # theme ("light"/"dark") -> SVG src_uri

    @property
    def name(self) -> str:
        return str(self.data.get("benchmark") or self.data.get("name") or Path(self.rel).stem)

    @property
    def results(self) -> Any:
        return self.data.get("results")


def load_results(root: Path) -> list[BenchmarkResult]:
    """Every readable ``benchmarks/results/*.json`` (a broken file is reported and skipped)."""
    results_dir = root / "benchmarks" / "results"
    found = []
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        rel = path.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            log.warning("benchmark results %s are not valid JSON: %s", rel, exc)
            continue
        if not isinstance(data, dict):
            log.warning("benchmark results %s: expected a JSON object at the top level", rel)
            continue
        found.append(BenchmarkResult(rel, data))
    return found


def _benchmark_title(res: BenchmarkResult) -> str:
    stem = Path(res.rel).stem
    variant = stem[len(res.name):].strip("_-") if stem.startswith(res.name) else stem
    return res.name + (f" · {variant.replace('_', ' ')}" if variant and variant != res.name else "")



def _provenance(res: BenchmarkResult) -> list[str]:
    """File link, hardware, commit and date on one line; hardware and config folded away."""
    data = res.data
    meta = [_file_link(res.rel)]
    if data.get("hardware") is not None:
        meta.append(_md_cell(_hardware_summary(data["hardware"])))
    for key in ("commit", "date", "timestamp"):
        if key in data:
            meta.append(f"{key} `{data[key]}`")
    out = [" · ".join(meta), "{ .minisgl-bench-meta }", ""]
    if data.get("description"):
        out.append(_md_cell(str(data["description"])) + "\n")
    setup = []
    if isinstance(data.get("hardware"), dict) and data["hardware"]:
        setup += _kv_table(data["hardware"], ("hardware", "")) + [""]
    if isinstance(data.get("config"), dict) and data["config"]:
        setup += _kv_table(data["config"], ("config", "")) + [""]
    if setup:
        out += ['??? info "Hardware and config"', ""] + _indent(setup)
    return out


def _generic_tables(data: dict) -> list[str]:
    """Tables for any results file: ``results`` (or ``numbers``/``metrics``), then other keys."""
    numbers_key = next((k for k in ("results", "numbers", "metrics") if k in data), None)
    skip = {"name", "benchmark", "hardware", "commit", "date", "timestamp", "description", "config", numbers_key}
    out: list[str] = []
    if numbers_key is not None:
        out += _results_block(data[numbers_key])
    rest = {k: v for k, v in data.items() if k not in skip}
    if rest:
        out.append("")
        out += _results_block(rest)
    return out


def _on_hardware(data: dict) -> str:
    """`` on NVIDIA H200`` for a plot title, or nothing when the file names no hardware."""
    hw = data.get("hardware")
    return f" on {_hardware_summary(hw)}" if hw else ""


def _config(data: dict) -> dict[str, Any]:
    """The ``config`` object of a results file, or ``{}`` when it has none."""
    config = data.get("config")
    return config if isinstance(config, dict) else {}


def _setup_parts(config: dict[str, Any]) -> list[str]:
    """The start of a workload line: the model in bold, then the device and the dtype."""
    parts = [f"**{_md_cell(str(config['model']))}**"] if config.get("model") else []
    return parts + [_md_cell(str(config[k])) for k in ("device", "dtype") if config.get(k)]


def _model_and_hardware(data: dict) -> str:
    """``qwen3-0.6b, NVIDIA H200``: the first cell of a comparison row (``—`` if neither is named)."""
    config = _config(data)
    where = [str(config["model"])] if config.get("model") else []
    where += [_hardware_summary(data["hardware"])] if data.get("hardware") else []
    return _md_cell(", ".join(where) or "—")


def _file_link(rel: str, shown: str | None = None) -> str:
    """A link to the repository file ``rel``, shown as code (``shown`` or ``rel``), written for
    a page in ``site/`` (the site's hook points it at the file on the repository's host)."""
    return f"[`{shown or rel}`](../{rel})"


def _plot_markdown(res: BenchmarkResult, alt: str) -> list[str]:
    """Image lines for the plot: the light variant in the light scheme, the dark one in the dark."""
    return [
        f"![{alt}]({uri}#only-{theme}){{ .minisgl-plot }}" for theme, uri in res.plots.items()
    ] + [""]


def _indent(lines: list[str]) -> list[str]:
    return [("    " + line) if line else "" for line in lines]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(v: float, unit: str = "") -> str:
    """A measured value for a label: 3 significant digits below 100, thousands separators above."""
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{text} {unit}".strip()


def _faster(speedup: float, than: str = "") -> str:
    """``1.33× faster`` (``0.76× as fast`` below 1): a ratio of times for a bar's label; with
    ``than``, ``1.33× faster than TP=1`` (``0.76× as fast as TP=1``)."""
    if speedup >= 1:
        return f"{_number(speedup)}× faster" + (f" than {than}" if than else "")
    return f"{_number(speedup)}× as fast" + (f" as {than}" if than else "")


def _short_count(n: int) -> str:
    """``512``, ``1K``, ``8K``, ``1M``: axis labels for powers of two."""
    for size, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return f"{n:,}"


# --------------------------------------------------------------------------------------------
# Benchmark plots (matplotlib, drawn into the build output at build time)
# --------------------------------------------------------------------------------------------

PLOT_DIR = "assets/benchmarks"  # a path of the built site only: nothing is written to site/
PLOT_WIDTH_IN = 9.2  # every plot is as wide as the page column (CSS), so fonts keep one size

# One variant of each plot per colour scheme of the site (Material shows ``#only-light`` images
# in the light scheme and ``#only-dark`` ones in the dark scheme); backgrounds stay transparent.
THEMES: dict[str, dict[str, Any]] = {
    "light": {
        "fg": "#3d4250",
        "muted": "#6b7080",
        "grid": "#dcdfe5",
        "series": ["#3f51b5", "#e8710a", "#0f9d58", "#c2185b", "#00838f", "#795548", "#7e57c2"],
        "accent": "#3f51b5",
        "other": "#9aa0ad",
    },
    "dark": {
        "fg": "#d3d6de",
        "muted": "#a4a9b6",
        "grid": "#3a3f4d",
        "series": ["#8c9eff", "#ffab40", "#69f0ae", "#f48fb1", "#4dd0e1", "#bcaaa4", "#b39ddb"],
        "accent": "#8c9eff",
        "other": "#7d8291",
    },
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def rc(theme: dict[str, Any]) -> dict[str, Any]:
    """matplotlib settings for one theme: readable sizes, theme colours, reproducible SVG."""
    fg, muted = theme["fg"], theme["muted"]
    return {
        "font.size": 10,
        "axes.titlesize": 11,
        "axes.titleweight": "bold",
        "axes.labelsize": 10,
        "figure.titlesize": 12,
        "figure.titleweight": "bold",
        "legend.fontsize": 9,
        "text.color": fg,
        "axes.labelcolor": fg,
        "axes.titlecolor": fg,
        "axes.edgecolor": muted,
        "xtick.color": muted,
        "ytick.color": muted,
        "xtick.labelcolor": fg,
        "ytick.labelcolor": fg,
        "axes.grid": True,
        "grid.color": theme["grid"],
        "grid.linewidth": 0.7,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
        "figure.facecolor": "none",
        "axes.facecolor": "none",
        "savefig.transparent": True,
        "svg.fonttype": "path",  # text as outlines: the same glyphs with any installed fonts
        "svg.hashsalt": "minisgl",  # stable element ids: the same SVG on every build
    }


def render_svgs(draw, res: BenchmarkResult) -> dict[str, str]:
    """``{theme: SVG text}``: ``draw(data, theme)`` rendered once per theme, or ``{}`` if no plot."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    svgs = {}
    for name, theme in THEMES.items():
        with matplotlib.rc_context(rc(theme)):
            fig = draw(res.data, theme)
            if fig is None:
                return {}
            FigureCanvasAgg(fig)
            buf = io.StringIO()
            # "tight" keeps a label that runs past the axes (a long bar's value) in the picture.
            fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=0.05)
            svgs[name] = buf.getvalue()
    return svgs


def _label_rows(ax: Any, labels: list[str]) -> None:
    """A horizontal chart's rows: ``labels`` top to bottom on the y axis (rows at 0, 1, ...),
    no y ticks, grid lines or left spine, the grid behind the bars."""
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.spines["left"].set_visible(False)
