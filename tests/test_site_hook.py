"""The site hook's drawing of benchmark results (site/hooks/minisgl_site.py), without a site
build: the committed offline files, and the same files with the newer static-batch baseline
(``results.hf_batched`` and ``results.speedup_vs_hf_batched``) added; the committed radix files
(cache off and on), and the same files without their ratios or with a run missing."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("minisgl_site_hook", REPO / "site" / "hooks" / "minisgl_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    module._state.update(root=REPO, repo_url="https://github.com/minisgl/minisgl")
    return module


def offline_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "offline")


def with_hf_batched(data: dict) -> dict:
    """A copy of ``data`` with the static-batch baseline the benchmark now writes."""
    data = copy.deepcopy(data)
    results = data["results"]
    engine = results["engine"]
    tok_s = engine["output_tok_s"] / 7.25
    results["hf_batched"] = {
        "requests": engine["requests"],
        "mode": "static batches of 64, left-padded",
        "batch_size": 64,
        "output_tokens": engine["output_tokens"],
        "time_s": engine["output_tokens"] / tok_s,
        "output_tok_s": tok_s,
    }
    results["speedup_vs_hf_batched"] = 7.25
    return data


def section(hook, data: dict, rel: str = "benchmarks/results/offline_x.json") -> str:
    lines = hook._offline_section(hook.BenchmarkResult(rel, data))
    assert lines is not None, "an offline result with engine numbers must get its own section"
    return "\n".join(lines)


def table_row(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"no table row {first_cell!r} in:\n{text}")


def test_there_are_offline_results_to_draw() -> None:
    assert offline_results(), "no committed offline result: this file tests nothing"


@pytest.mark.parametrize("path", offline_results(), ids=lambda p: p.stem)
def test_both_baselines_and_both_ratios(hook, path: Path) -> None:
    data = with_hf_batched(json.loads(path.read_text(encoding="utf-8")))
    results = data["results"]
    text = section(hook, data)
    header = next(line for line in text.splitlines() if line.startswith("| |"))
    assert header.index("minisgl engine") < header.index("static batches of 64, left-padded") < header.index("one request at a time")
    speedups = table_row(text, "minisgl speed-up")
    assert speedups == ["—", "**7.25×**", f"**{hook._number(results['speedup_vs_hf'])}×**"]
    assert table_row(text, "batch_size") == ["—", "64", "—"]
    assert "speedup_vs_hf" not in text, "the ratios are in the speed-up row, not repeated as raw keys"

    bars = hook._offline_bars(data)
    assert [(is_engine, speedup) for _, _, is_engine, speedup in bars] == [
        (True, None), (False, 7.25), (False, pytest.approx(results["speedup_vs_hf"])),
    ]
    assert "static batches of 64" in bars[1][0] and "one request at a time" in bars[2][0]
    fig = hook._draw_offline(data, hook.THEMES["light"])
    (ax,) = fig.axes
    assert len(ax.patches) == 3, "one bar per run"
    notes = [t.get_text() for t in ax.texts]
    assert sum("minisgl is 7.25× faster" in n for n in notes) == 1
    assert sum(f"minisgl is {hook._number(results['speedup_vs_hf'])}× faster" in n for n in notes) == 1


@pytest.mark.parametrize("path", offline_results(), ids=lambda p: p.stem)
def test_files_without_the_batched_baseline_still_work(hook, path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    if "hf_batched" in data["results"]:
        pytest.skip("this file already has the batched baseline")
    text = section(hook, data)
    assert table_row(text, "minisgl speed-up") == ["—", f"**{hook._number(data['results']['speedup_vs_hf'])}×**"]
    assert "static batches" not in text
    fig = hook._draw_offline(data, hook.THEMES["dark"])
    assert len(fig.axes[0].patches) == 2


def test_ratio_is_computed_when_the_file_has_none(hook) -> None:
    data = with_hf_batched(json.loads(offline_results()[0].read_text(encoding="utf-8")))
    del data["results"]["speedup_vs_hf_batched"], data["results"]["speedup_vs_hf"]
    results = data["results"]
    expected = results["engine"]["output_tok_s"] / results["hf_batched"]["output_tok_s"]
    assert hook._offline_speedup(results, "hf_batched", "speedup_vs_hf_batched") == pytest.approx(expected)
    assert table_row(section(hook, data), "minisgl speed-up")[1] == f"**{hook._number(expected)}×**"


def test_svgs_render_for_both_themes(hook) -> None:
    data = with_hf_batched(json.loads(offline_results()[0].read_text(encoding="utf-8")))
    svgs = hook._render_svgs(hook._draw_offline, hook.BenchmarkResult("benchmarks/results/x.json", data))
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# --------------------------------------------------------------------------------------------
# radix: the prefix cache on and off (results.cache_off, results.cache_on, results.speedup)
# --------------------------------------------------------------------------------------------


def radix_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "radix")


def radix_section(hook, data: dict, rel: str = "benchmarks/results/radix_x.json") -> str:
    lines = hook._radix_section(hook.BenchmarkResult(rel, data))
    assert lines is not None, "a radix result with both runs must get its own section"
    return "\n".join(lines)


def test_there_are_radix_results_to_draw() -> None:
    assert radix_results(), "no committed radix result: the radix tests below test nothing"


@pytest.mark.parametrize("path", radix_results(), ids=lambda p: p.stem)
def test_radix_section_plot_and_numbers(hook, path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    config, results = data["config"], data["results"]
    off, on = results["cache_off"], results["cache_on"]
    text = radix_section(hook, data)
    headline = text.splitlines()[0]
    for part in (f"{config['groups'] * config['per_group']:,} requests = {config['groups']} groups × {config['per_group']}",
                 f"{config['system_len']:,}-token system prompt", f"{config['question_len']:,}-token question",
                 f"{config['output_len']:,}-token answers"):
        assert part in headline, f"{part!r} missing from the workload line {headline!r}"
    header = next(line for line in text.splitlines() if line.startswith("| |"))
    assert header == "| | cache off | cache on |", "one column per run, cache off first"
    assert table_row(text, "output_tok_s") == [hook._fmt(off["output_tok_s"]), hook._fmt(on["output_tok_s"])]
    assert table_row(text, "hit_rate") == [hook._fmt(off["hit_rate"]), hook._fmt(on["hit_rate"])]
    assert table_row(text, hook.RADIX_SPEEDUP_ROW) == ["—", f"**{hook._number(results['speedup'])}×**"]
    assert "| prefix_cache |" not in text and "| speedup |" not in text, "the columns and the speed-up row say these"

    fig = hook._draw_radix(data, hook.THEMES["light"])
    tput, rate = fig.axes
    assert [p.get_width() for p in tput.patches] == pytest.approx([off["output_tok_s"], on["output_tok_s"]])
    assert [p.get_width() for p in rate.patches] == pytest.approx([100 * off["hit_rate"], 100 * on["hit_rate"]])
    notes = [t.get_text() for t in tput.texts]
    assert sum(f"{hook._number(results['speedup'])}× faster" in n for n in notes) == 1, notes
    assert [t.get_text() for t in rate.texts] == [f"{off['hit_rate']:.1%}", f"{on['hit_rate']:.1%}"]
    assert f"{config['output_len']:,}-token answers" in fig.texts[0].get_text(), "the title names the answer length"


def test_radix_ratios_are_computed_when_the_file_has_none(hook) -> None:
    data = copy.deepcopy(json.loads(radix_results()[0].read_text(encoding="utf-8")))
    results = data["results"]
    del results["speedup"], results["cache_on"]["hit_rate"]
    on = results["cache_on"]
    speedup = on["output_tok_s"] / results["cache_off"]["output_tok_s"]
    assert hook._radix_speedup(results) == pytest.approx(speedup)
    assert hook._radix_hit_rate(on) == pytest.approx(on["cached_prompt_tokens"] / on["prompt_tokens"])
    assert table_row(radix_section(hook, data), hook.RADIX_SPEEDUP_ROW)[1] == f"**{hook._number(speedup)}×**"
    assert len(hook._draw_radix(data, hook.THEMES["dark"]).axes) == 2

    del on["cached_prompt_tokens"]  # no hit rate at all: the throughput bars alone
    assert len(hook._draw_radix(data, hook.THEMES["dark"]).axes) == 1


def test_radix_file_without_both_runs_gets_tables(hook) -> None:
    data = copy.deepcopy(json.loads(radix_results()[0].read_text(encoding="utf-8")))
    del data["results"]["cache_on"]
    res = hook.BenchmarkResult("benchmarks/results/radix_x.json", data)
    assert hook._radix_section(res) is None and hook._draw_radix(data, hook.THEMES["light"]) is None
    assert hook._render_svgs(hook._draw_radix, res) == {}
    assert "output_tok_s" in "\n".join(hook._generic_tables(data)), "the generic tables still show the numbers"


def test_radix_comparison_has_a_row_per_file(hook) -> None:
    hook._state["benchmarks"] = hook._load_benchmark_results(REPO)
    try:
        table = hook._radix_comparison().splitlines()
    finally:
        del hook._state["benchmarks"]
    rows = table[2:]
    assert len(rows) == len(radix_results())
    for row, path in zip(rows, radix_results()):
        data = json.loads(path.read_text(encoding="utf-8"))
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert cells[1].endswith(f"{data['config']['output_len']:,}-token answers")
        assert cells[2] == f"{data['results']['cache_on']['hit_rate']:.1%}"
        assert cells[5] == f"**{hook._number(data['results']['speedup'])}×**"
        assert f"`{path.name}`" in cells[6]


def test_radix_comparison_without_results(hook) -> None:
    hook._state["benchmarks"] = []
    try:
        assert "No radix results" in hook._radix_comparison()
    finally:
        del hook._state["benchmarks"]


def test_radix_svgs_render_for_both_themes(hook) -> None:
    res = hook.BenchmarkResult("benchmarks/results/radix_x.json", json.loads(radix_results()[0].read_text(encoding="utf-8")))
    svgs = hook._render_svgs(hook._draw_radix, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())
