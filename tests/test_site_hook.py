"""The site hook's drawing of benchmark results (site/hooks/minisgl_site.py), without a site
build: the committed offline files, and the same files with the newer static-batch baseline
(``results.hf_batched`` and ``results.speedup_vs_hf_batched``) added; the committed radix files
(cache off and on), and the same files without their ratios or with a run missing; the
committed chunked-prefill files (whole prompts against each chunk size), and the same files
without their ratios, their yardstick or other keys."""

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


# --------------------------------------------------------------------------------------------
# chunked: short requests behind a long prompt (results.settings, results.yardstick)
# --------------------------------------------------------------------------------------------


def chunked_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "chunked")


def chunked_section(hook, data: dict, rel: str = "benchmarks/results/chunked_x.json") -> str:
    lines = hook._chunked_section(hook.BenchmarkResult(rel, data))
    assert lines is not None, "a chunked result with whole prompts and a chunk size must get its own section"
    return "\n".join(lines)


def chunked_data(index: int = 0) -> dict:
    return copy.deepcopy(json.loads(chunked_results()[index].read_text(encoding="utf-8")))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def test_there_are_chunked_results_to_draw() -> None:
    assert chunked_results(), "no committed chunked result: the chunked tests below test nothing"


@pytest.mark.parametrize("path", chunked_results(), ids=lambda p: p.stem)
def test_chunked_section_plot_and_numbers(hook, path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    config, results = data["config"], data["results"]
    settings, yard = results["settings"], results["yardstick"]
    chunks = [k for k in settings if k != "whole"]
    text = chunked_section(hook, data)
    workload, ratios = [line for line in text.splitlines() if line][:2]
    for part in (f"one {config['long_len']:,}-token prompt", f"{config['num_short']} × {config['short_len']:,}-token requests",
                 f"({ms(results['whole_prefill_s'])})", f"{config['output_len']}-token answers"):
        assert part in workload, f"{part!r} missing from the workload line {workload!r}"
    for key in chunks:
        size = settings[key]["chunked_prefill_size"]
        assert f"**{hook._number(settings[key]['p99_ratio_vs_whole'])}× lower** at {size:,}" in ratios, ratios
        assert f"**{yard[key]['vs_whole']:.3f}×** at {size:,}" in ratios, ratios

    for key, run in settings.items():
        short = run["short_ttft_s"]
        ratio = "—" if key == "whole" else f"**{hook._number(run['p99_ratio_vs_whole'])}× lower**"
        assert table_row(text, f"`{key}`") == [
            f"{run['chunked_prefill_size']:,}" if key != "whole" else "—",
            ms(short["p50"]), ms(short["p90"]), f"**{ms(short['p99'])}**", ms(run["long_ttft_s"]), ratio,
            f"{hook._number(yard[key]['output_tok_s'])} ({yard[key]['vs_whole']:.3f}×)",
        ]
    assert "Offline yardstick runs" in text
    assert "arrivals_s" not in text and "| whole_prefill_s |" not in text, "summarised above, not dumped"

    fig = hook._draw_chunked(data, hook.THEMES["light"])
    ttft, tput = fig.axes
    long, p50, p99 = ttft.containers
    assert [b.get_height() for b in long] == pytest.approx([1e3 * settings[k]["long_ttft_s"] for k in settings])
    assert [b.get_height() for b in p50] == pytest.approx([1e3 * settings[k]["short_ttft_s"]["p50"] for k in settings])
    assert [b.get_height() for b in p99] == pytest.approx([1e3 * settings[k]["short_ttft_s"]["p99"] for k in settings])
    notes = [t.get_text() for t in ttft.texts]
    assert [n for n in notes if "lower" in n] == [
        f"{1e3 * settings[k]['short_ttft_s']['p99']:.1f}\n{hook._number(settings[k]['p99_ratio_vs_whole'])}× lower" for k in chunks
    ]
    assert [p.get_height() for p in tput.patches] == pytest.approx([yard[k]["vs_whole"] for k in settings])
    assert [t.get_text() for t in tput.texts] == [f"{yard[k]['vs_whole']:.3f}×" for k in settings]
    assert f"{config['long_len']:,}-token prompt" in fig.texts[0].get_text(), "the title names the long prompt"


def test_chunked_ratios_are_computed_when_the_file_has_none(hook) -> None:
    data = chunked_data()
    settings, yard = data["results"]["settings"], data["results"]["yardstick"]
    expected = {}
    for key in settings:
        del settings[key]["p99_ratio_vs_whole"], yard[key]["vs_whole"]
        expected[key] = (settings["whole"]["short_ttft_s"]["p99"] / settings[key]["short_ttft_s"]["p99"],
                         yard[key]["output_tok_s"] / yard["whole"]["output_tok_s"])
    text = chunked_section(hook, data)
    for key, (p99, tput) in expected.items():
        assert hook._chunked_p99_ratio(settings, key) == pytest.approx(p99)
        assert hook._chunked_yardstick(data, key) == pytest.approx((yard[key]["output_tok_s"], tput))
        cells = table_row(text, f"`{key}`")
        assert cells[-1].endswith(f"({tput:.3f}×)")
        if key != "whole":
            assert cells[-2] == f"**{hook._number(p99)}× lower**"
    assert len(hook._draw_chunked(data, hook.THEMES["dark"]).axes) == 2


def test_chunked_file_with_missing_keys_still_draws(hook) -> None:
    data = chunked_data()
    results = data["results"]
    del data["config"], data["hardware"], results["yardstick"], results["whole_prefill_s"]
    chunk = next(k for k in results["settings"] if k != "whole")
    run = results["settings"][chunk]
    del run["long_ttft_s"], run["short_ttft_s"]["p90"], run["chunked_prefill_size"]  # the size is in the key
    results["settings"]["chunk_broken"] = {"short_ttft_s": {"mean": 0.1}}  # no percentiles: left out
    text = chunked_section(hook, data)
    cells = table_row(text, f"`{chunk}`")
    assert cells[0] == f"{int(chunk.removeprefix('chunk_')):,}"
    assert cells[2] == "—" and cells[4] == "—" and cells[6] == "—", cells
    assert "chunk_broken" not in text and "Offline yardstick runs" not in text and "yardstick throughput" not in text
    fig = hook._draw_chunked(data, hook.THEMES["light"])
    (ttft,) = fig.axes  # no yardstick: the TTFT bars alone
    assert len(ttft.containers) == 2, "no long-request bars when a setting lacks its long_ttft_s"
    assert fig.texts[0].get_text() == "Chunked prefill"

    results["settings"] = {"whole": results["settings"]["whole"]}  # nothing to compare with
    res = hook.BenchmarkResult("benchmarks/results/chunked_x.json", data)
    assert hook._chunked_section(res) is None and hook._draw_chunked(data, hook.THEMES["light"]) is None
    assert hook._render_svgs(hook._draw_chunked, res) == {}
    assert "short_ttft_s.p99" in "\n".join(hook._generic_tables(data)), "the generic tables still show the numbers"
    for results in (None, [], {"settings": []}, {"settings": {"chunk_64": {}}}):
        assert hook._draw_chunked({"results": results}, hook.THEMES["dark"]) is None


def test_chunked_comparison_has_a_row_per_chunk_size(hook) -> None:
    hook._state["benchmarks"] = hook._load_benchmark_results(REPO)
    try:
        table = hook._chunked_comparison().splitlines()
    finally:
        del hook._state["benchmarks"]
    rows = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table[2:]]
    expected = []
    for path in chunked_results():
        data = json.loads(path.read_text(encoding="utf-8"))
        settings = data["results"]["settings"]
        for i, key in enumerate(k for k in settings if k != "whole"):
            expected.append((path.name if i == 0 else "", settings[key]["chunked_prefill_size"],
                             f"{settings['whole']['short_ttft_s']['p99'] * 1e3:,.1f}", ms(settings[key]["short_ttft_s"]["p99"]),
                             hook._number(settings[key]["p99_ratio_vs_whole"]), data["results"]["yardstick"][key]["vs_whole"]))
    assert len(rows) == len(expected)
    for cells, (name, size, whole, p99, ratio, vs_whole) in zip(rows, expected):
        assert cells[2] == f"{size:,}"
        assert cells[3] == f"{whole} → {p99}"
        assert cells[4] == f"**{ratio}× lower**"
        assert cells[5] == f"{vs_whole:.3f}×"
        assert (f"`{name}`" in cells[6]) if name else (cells[0] == cells[1] == cells[6] == ""), cells


def test_chunked_comparison_without_results(hook) -> None:
    hook._state["benchmarks"] = []
    try:
        assert "No chunked-prefill results" in hook._chunked_comparison()
    finally:
        del hook._state["benchmarks"]


def test_chunked_svgs_render_for_both_themes(hook) -> None:
    res = hook.BenchmarkResult("benchmarks/results/chunked_x.json", chunked_data())
    svgs = hook._render_svgs(hook._draw_chunked, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


def test_long_nested_values_are_summarised_in_generic_tables(hook) -> None:
    """A per-step trace in a results file is not spelled out on the page; short ones are."""
    trace = [{"schedule": [0.0, 0.3], "launch": [0.3, 7.4]} for _ in range(12)]
    assert hook._fmt(trace) == "12 entries (in the results file)"
    assert hook._fmt({"a": [1, 2]}) == '`{"a":[1,2]}`'
