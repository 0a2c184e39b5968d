"""The drawing of benchmark results (``benchmarks.plots``: the charts of the notebooks and of
the site's Benchmarks page, and that page's tables), without a site build: the committed offline files, and the same files with the newer static-batch baseline
(``results.hf_batched`` and ``results.speedup_vs_hf_batched``) added or taken out (a file with
the static batches as its only baseline too), a lesson's target on a shape judged (the 30B-A3B
MoE's 10× over HF's static batches) and a small workload said to be; the committed radix files
(cache off and on), and the same files without their ratios or with a run missing; the
committed chunked-prefill files (whole prompts against each chunk size), and the same files
without their ratios, their yardstick or other keys; overlap results (a CPU sample written here,
and the committed files: the traced timeline, batch-size-1 decode, the yardstick in its newer
repeated form and its older single-run form) and host results (a CPU sample: the scheduler's
host time per load and tree, and the batch-size-1 profile), and CUDA-graphs results (a
made-up sample and the committed files: batch-size-1 decode, kernels per step by kind, the
captured graphs, the yardstick), and tensor-parallel results (a made-up GPU sample, a trimmed
CPU run and the committed files: batch-size-1 decode per TP size, kernels per step by kind,
the all-reduce per message size, traced decode steps, the yardstick), and serving results
(made-up runs: latency percentiles and throughput against the request rate with an all-at-once
point, the radix cache and chunked prefill off and on through the server; a run against a given
server; all at once alone), each also with keys missing; the yardstick step by step (the
committed files: step groups against their bound, the profiled windows); and mixture-of-experts
results (the committed files, each by what it holds: the layer per batch size against the
reference and its bytes bound, bs=1 decode against its roofline, lesson 11's targets judged from
the numbers; or one GPU against TP=2 against EP=2: bs=1 decode, the all-reduces' share of a step,
the yardstick; a made-up run with the targets reached, missed and not judged; a made-up parallel
run, with parts missing and beside layer rows; malformed files; and the newer parts, in the
committed H200 file and a made-up run, together and each alone: the layer's grouped and
matrix-vector forms side by side, the tiles and crossover chosen, each form's kernels at bs=1, a
bs=1 decode step's kernels by kind, the expert-load histogram)."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from benchmarks import plots  # noqa: E402
from benchmarks.plots import chunked, common, graphs, host, offline, overlap, radix, serving, tp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


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


def section(data: dict, rel: str = "benchmarks/results/offline_x.json") -> str:
    lines = offline.offline_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "an offline result with engine numbers must get its own section"
    return "\n".join(lines)


def table_row(text: str, first_cell: str, after: str = "") -> list[str]:
    """The cells after the first of the table row whose first cell is ``first_cell`` (the first
    such row after the line ``after`` when given)."""
    lines = text.splitlines()
    for line in lines[lines.index(after) if after else 0:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"no table row {first_cell!r} in:\n{text}")


def test_there_are_offline_results_to_draw() -> None:
    assert offline_results(), "no committed offline result: this file tests nothing"


@pytest.mark.parametrize("path", offline_results(), ids=lambda p: p.stem)
def test_both_baselines_and_both_ratios(path: Path) -> None:
    """The static-batch baseline (7.25× here) beside one request at a time where the file has
    that run (a file of a large shape may have only the static batches)."""
    data = with_hf_batched(json.loads(path.read_text(encoding="utf-8")))
    results = data["results"]
    one_at_a_time = "hf" in results
    text = section(data)
    header = next(line for line in text.splitlines() if line.startswith("| |"))
    assert header.index("minisgl engine") < header.index("static batches of 64, left-padded")
    if one_at_a_time:
        assert header.index("static batches of 64, left-padded") < header.index("one request at a time")
    else:
        assert "one request at a time" not in header
    speedups = table_row(text, "minisgl speed-up")
    assert speedups == ["—", "**7.25×**"] + ([f"**{common._number(results['speedup_vs_hf'])}×**"] if one_at_a_time else [])
    assert table_row(text, "batch_size") == ["—", "64"] + (["—"] if one_at_a_time else [])
    assert "speedup_vs_hf" not in text, "the ratios are in the speed-up row, not repeated as raw keys"

    bars = offline._offline_bars(data)
    expected = [(True, None), (False, 7.25)] + ([(False, pytest.approx(results["speedup_vs_hf"]))] if one_at_a_time else [])
    assert [(is_engine, speedup) for _, _, is_engine, speedup in bars] == expected
    assert "static batches of 64" in bars[1][0] and (not one_at_a_time or "one request at a time" in bars[2][0])
    fig = offline.draw_offline(data, common.THEMES["light"])
    (ax,) = fig.axes
    assert len(ax.patches) == len(expected), "one bar per run"
    assert ax.get_title(loc="left") == f"Output throughput ({data['config']['model']}) on {common._hardware_summary(data['hardware'])}"
    notes = [t.get_text() for t in ax.texts]
    assert sum("minisgl is 7.25× faster" in n for n in notes) == 1
    if one_at_a_time:
        assert sum(f"minisgl is {common._number(results['speedup_vs_hf'])}× faster" in n for n in notes) == 1


@pytest.mark.parametrize("path", offline_results(), ids=lambda p: p.stem)
def test_files_without_the_batched_baseline_still_work(path: Path) -> None:
    """Files written before the static-batch baseline existed; a file that has it is checked
    with it taken out (no skip: every committed file exercises this path). A file whose only
    baseline was the static batches is left with the engine alone: no ratio."""
    data = copy.deepcopy(json.loads(path.read_text(encoding="utf-8")))
    for key in ("hf_batched", "speedup_vs_hf_batched"):
        data["results"].pop(key, None)
    one_at_a_time = "hf" in data["results"]
    text = section(data)
    if one_at_a_time:
        assert table_row(text, "minisgl speed-up") == ["—", f"**{common._number(data['results']['speedup_vs_hf'])}×**"]
    else:
        assert "minisgl speed-up" not in text, "no baseline, no ratio"
    assert "static batches or more" not in text or "not judged (no static-batch baseline in this run)" in text
    assert "static batches of" not in text
    fig = offline.draw_offline(data, common.THEMES["dark"])
    assert len(fig.axes[0].patches) == 1 + one_at_a_time


@pytest.mark.parametrize("path", offline_results(), ids=lambda p: p.stem)
def test_lesson_targets_and_small_workloads_are_said(path: Path) -> None:
    """A shape a lesson sets a target on (the 30B-A3B MoE: the yardstick at 10× HF's static
    batches or more) gets it judged from the file's ratio; a workload smaller than the yardstick's
    256 requests of 100–1,024 tokens is said to be."""
    data = json.loads(path.read_text(encoding="utf-8"))
    config, results = data["config"], data["results"]
    text = section(data)
    target = offline.OFFLINE_TARGETS.get(config["model"])
    if target is None:
        assert "Target of" not in text
    else:
        lesson, least = target
        what = f"Target of {lesson}: the yardstick at {common._number(least)}× HF generate in static batches or more, " \
            "on the same workload"
        if "hf_batched" not in results:  # the `all` entry leaves HF's static batches out
            assert f"{what}: not judged (no static-batch baseline in this run)." in text
        else:
            ratio = results["speedup_vs_hf_batched"]
            verdict = "reached" if ratio >= least else "not reached"
            assert f"{what}: **{common._number(ratio)}×, {verdict}**." in text
    lo, hi = config["len_range"]
    small = config["num_requests"] < 256 or lo < 100 or hi < 1024
    note = (f"A smaller workload than the yardstick's (256 requests, input and output lengths 100–1,024 tokens): "
            f"{config['num_requests']:,} requests of {lo:,}–{hi:,} tokens")
    assert (note in text) == small
    assert f"**{config['model']}**" in text, "the shape, named"


def test_the_30b_moe_file_is_judged_by_lesson_11() -> None:
    """The committed 30B-A3B run with HF (de0f6b5, before the `all` entry left HF out): its
    shape, HF's static batches only, the 10× target reached, its small workload said; a made-up
    ratio under 10 misses it, a file without the static batches is not judged."""
    data = json.loads((RESULTS / "offline_qwen3-30b-a3b_hf_de0f6b5_h200.json").read_text(encoding="utf-8"))
    text = section(data)
    assert text.startswith("**qwen3-30b-a3b** · cuda · bfloat16 · 64 requests · input and output lengths 64–256 tokens")
    assert "[lesson 11](../lessons/l11/README.md)" in text and "**10.9×, reached**" in text
    assert "64 requests of 64–256 tokens, so at most 64 are in flight" in text
    assert table_row(text, "minisgl speed-up") == ["—", "**10.9×**"]
    low = copy.deepcopy(data)
    low["results"]["speedup_vs_hf_batched"] = 9.95
    assert "**9.95×, not reached**" in section(low)
    del low["results"]["speedup_vs_hf_batched"]
    low["results"]["hf_batched"]["output_tok_s"] = low["results"]["engine"]["output_tok_s"] / 12
    assert "**12×, reached**" in section(low), "the ratio computed where the file has none"
    del low["results"]["hf_batched"]
    assert "not judged (no static-batch baseline in this run)" in section(low)
    full = copy.deepcopy(data)
    full["config"].update(num_requests=256, len_range=[100, 1024])
    assert "A smaller workload" not in section(full)


def test_ratio_is_computed_when_the_file_has_none() -> None:
    data = with_hf_batched(json.loads(offline_results()[0].read_text(encoding="utf-8")))
    del data["results"]["speedup_vs_hf_batched"], data["results"]["speedup_vs_hf"]
    results = data["results"]
    expected = results["engine"]["output_tok_s"] / results["hf_batched"]["output_tok_s"]
    assert offline._offline_speedup(results, "hf_batched", "speedup_vs_hf_batched") == pytest.approx(expected)
    assert table_row(section(data), "minisgl speed-up")[1] == f"**{common._number(expected)}×**"


def test_svgs_render_for_both_themes() -> None:
    data = with_hf_batched(json.loads(offline_results()[0].read_text(encoding="utf-8")))
    svgs = common.render_svgs(offline.draw_offline, common.BenchmarkResult("benchmarks/results/x.json", data))
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# --------------------------------------------------------------------------------------------
# radix: the prefix cache on and off (results.cache_off, results.cache_on, results.speedup)
# --------------------------------------------------------------------------------------------


def radix_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "radix")


def radix_section(data: dict, rel: str = "benchmarks/results/radix_x.json") -> str:
    lines = radix.radix_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "a radix result with both runs must get its own section"
    return "\n".join(lines)


def test_there_are_radix_results_to_draw() -> None:
    assert radix_results(), "no committed radix result: the radix tests below test nothing"


@pytest.mark.parametrize("path", radix_results(), ids=lambda p: p.stem)
def test_radix_section_plot_and_numbers(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    config, results = data["config"], data["results"]
    off, on = results["cache_off"], results["cache_on"]
    text = radix_section(data)
    headline = text.splitlines()[0]
    for part in (f"{config['groups'] * config['per_group']:,} requests = {config['groups']} groups × {config['per_group']}",
                 f"{config['system_len']:,}-token system prompt", f"{config['question_len']:,}-token question",
                 f"{config['output_len']:,}-token answers"):
        assert part in headline, f"{part!r} missing from the workload line {headline!r}"
    header = next(line for line in text.splitlines() if line.startswith("| |"))
    assert header == "| | cache off | cache on |", "one column per run, cache off first"
    assert table_row(text, "output_tok_s") == [common._fmt(off["output_tok_s"]), common._fmt(on["output_tok_s"])]
    assert table_row(text, "hit_rate") == [common._fmt(off["hit_rate"]), common._fmt(on["hit_rate"])]
    assert table_row(text, radix.RADIX_SPEEDUP_ROW) == ["—", f"**{common._number(results['speedup'])}×**"]
    assert "| prefix_cache |" not in text and "| speedup |" not in text, "the columns and the speed-up row say these"

    fig = radix.draw_radix(data, common.THEMES["light"])
    tput, rate = fig.axes
    assert [p.get_width() for p in tput.patches] == pytest.approx([off["output_tok_s"], on["output_tok_s"]])
    assert [p.get_width() for p in rate.patches] == pytest.approx([100 * off["hit_rate"], 100 * on["hit_rate"]])
    notes = [t.get_text() for t in tput.texts]
    assert sum(f"{common._number(results['speedup'])}× faster" in n for n in notes) == 1, notes
    assert [t.get_text() for t in rate.texts] == [f"{off['hit_rate']:.1%}", f"{on['hit_rate']:.1%}"]
    assert f"{config['output_len']:,}-token answers" in fig.texts[0].get_text(), "the title names the answer length"


def test_radix_ratios_are_computed_when_the_file_has_none() -> None:
    data = copy.deepcopy(json.loads(radix_results()[0].read_text(encoding="utf-8")))
    results = data["results"]
    del results["speedup"], results["cache_on"]["hit_rate"]
    on = results["cache_on"]
    speedup = on["output_tok_s"] / results["cache_off"]["output_tok_s"]
    assert radix._radix_speedup(results) == pytest.approx(speedup)
    assert radix._radix_hit_rate(on) == pytest.approx(on["cached_prompt_tokens"] / on["prompt_tokens"])
    assert table_row(radix_section(data), radix.RADIX_SPEEDUP_ROW)[1] == f"**{common._number(speedup)}×**"
    assert len(radix.draw_radix(data, common.THEMES["dark"]).axes) == 2

    del on["cached_prompt_tokens"]  # no hit rate at all: the throughput bars alone
    assert len(radix.draw_radix(data, common.THEMES["dark"]).axes) == 1


def test_radix_file_without_both_runs_gets_tables() -> None:
    data = copy.deepcopy(json.loads(radix_results()[0].read_text(encoding="utf-8")))
    del data["results"]["cache_on"]
    res = common.BenchmarkResult("benchmarks/results/radix_x.json", data)
    assert radix.radix_section(res) is None and radix.draw_radix(data, common.THEMES["light"]) is None
    assert common.render_svgs(radix.draw_radix, res) == {}
    assert "output_tok_s" in "\n".join(common._generic_tables(data)), "the generic tables still show the numbers"


def test_radix_comparison_has_a_row_per_file() -> None:
    table = radix.radix_comparison(plots.load_results(REPO)).splitlines()
    rows = table[2:]
    assert len(rows) == len(radix_results())
    for row, path in zip(rows, radix_results()):
        data = json.loads(path.read_text(encoding="utf-8"))
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert cells[1].endswith(f"{data['config']['output_len']:,}-token answers")
        assert cells[2] == f"{data['results']['cache_on']['hit_rate']:.1%}"
        assert cells[5] == f"**{common._number(data['results']['speedup'])}×**"
        assert f"`{path.name}`" in cells[6]


def test_radix_comparison_without_results() -> None:
    assert "No radix results" in radix.radix_comparison([])


def test_radix_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/radix_x.json", json.loads(radix_results()[0].read_text(encoding="utf-8")))
    svgs = common.render_svgs(radix.draw_radix, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# --------------------------------------------------------------------------------------------
# chunked: short requests behind a long prompt (results.settings, results.yardstick)
# --------------------------------------------------------------------------------------------


def chunked_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "chunked")


def chunked_section(data: dict, rel: str = "benchmarks/results/chunked_x.json") -> str:
    lines = chunked.chunked_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "a chunked result with whole prompts and a chunk size must get its own section"
    return "\n".join(lines)


def chunked_data(index: int = 0) -> dict:
    return copy.deepcopy(json.loads(chunked_results()[index].read_text(encoding="utf-8")))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def test_there_are_chunked_results_to_draw() -> None:
    assert chunked_results(), "no committed chunked result: the chunked tests below test nothing"


def _lower_or_higher(ratio: float) -> str:
    """How a p99 TTFT ratio (whole prompts' over a chunk size's) reads: ``2.27× lower``, or, when
    chunking made it worse (a ratio below one), ``1.05× higher``."""
    return f"{common._number(1 / ratio)}× higher" if ratio < 1 else f"{common._number(ratio)}× lower"


@pytest.mark.parametrize("path", chunked_results(), ids=lambda p: p.stem)
def test_chunked_section_plot_and_numbers(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    config, results = data["config"], data["results"]
    settings, yard = results["settings"], results["yardstick"]
    chunks = [k for k in settings if k != "whole"]
    text = chunked_section(data)
    workload, ratios = [line for line in text.splitlines() if line][:2]
    for part in (f"one {config['long_len']:,}-token prompt", f"{config['num_short']} × {config['short_len']:,}-token requests",
                 f"({ms(results['whole_prefill_s'])})", f"{config['output_len']}-token answers"):
        assert part in workload, f"{part!r} missing from the workload line {workload!r}"
    for key in chunks:
        size = settings[key]["chunked_prefill_size"]
        assert f"**{_lower_or_higher(settings[key]['p99_ratio_vs_whole'])}** at {size:,}" in ratios, ratios
        assert f"**{yard[key]['vs_whole']:.3f}×** at {size:,}" in ratios, ratios

    for key, run in settings.items():
        short = run["short_ttft_s"]
        ratio = "—" if key == "whole" else f"**{_lower_or_higher(run['p99_ratio_vs_whole'])}**"
        assert table_row(text, f"`{key}`") == [
            f"{run['chunked_prefill_size']:,}" if key != "whole" else "—",
            ms(short["p50"]), ms(short["p90"]), f"**{ms(short['p99'])}**", ms(run["long_ttft_s"]), ratio,
            f"{common._number(yard[key]['output_tok_s'])} ({yard[key]['vs_whole']:.3f}×)",
        ]
    assert "Offline yardstick runs" in text
    assert "arrivals_s" not in text and "| whole_prefill_s |" not in text, "summarised above, not dumped"

    fig = chunked.draw_chunked(data, common.THEMES["light"])
    ttft, tput = fig.axes
    long, p50, p99 = ttft.containers
    assert [b.get_height() for b in long] == pytest.approx([1e3 * settings[k]["long_ttft_s"] for k in settings])
    assert [b.get_height() for b in p50] == pytest.approx([1e3 * settings[k]["short_ttft_s"]["p50"] for k in settings])
    assert [b.get_height() for b in p99] == pytest.approx([1e3 * settings[k]["short_ttft_s"]["p99"] for k in settings])
    notes = [t.get_text() for t in ttft.texts]
    assert [n for n in notes if "lower" in n or "higher" in n] == [
        f"{1e3 * settings[k]['short_ttft_s']['p99']:.1f}\n{_lower_or_higher(settings[k]['p99_ratio_vs_whole'])}" for k in chunks
    ]
    assert [p.get_height() for p in tput.patches] == pytest.approx([yard[k]["vs_whole"] for k in settings])
    assert [t.get_text() for t in tput.texts] == [f"{yard[k]['vs_whole']:.3f}×" for k in settings]
    assert f"{config['long_len']:,}-token prompt" in fig.texts[0].get_text(), "the title names the long prompt"


def test_chunked_ratios_are_computed_when_the_file_has_none() -> None:
    data = chunked_data()
    settings, yard = data["results"]["settings"], data["results"]["yardstick"]
    expected = {}
    for key in settings:
        del settings[key]["p99_ratio_vs_whole"], yard[key]["vs_whole"]
        expected[key] = (settings["whole"]["short_ttft_s"]["p99"] / settings[key]["short_ttft_s"]["p99"],
                         yard[key]["output_tok_s"] / yard["whole"]["output_tok_s"])
    text = chunked_section(data)
    for key, (p99, tput) in expected.items():
        assert chunked._chunked_p99_ratio(settings, key) == pytest.approx(p99)
        assert chunked._chunked_yardstick(data, key) == pytest.approx((yard[key]["output_tok_s"], tput))
        cells = table_row(text, f"`{key}`")
        assert cells[-1].endswith(f"({tput:.3f}×)")
        if key != "whole":
            assert cells[-2] == f"**{common._number(p99)}× lower**"
    assert len(chunked.draw_chunked(data, common.THEMES["dark"]).axes) == 2


def test_chunked_file_with_missing_keys_still_draws() -> None:
    data = chunked_data()
    results = data["results"]
    del data["config"], data["hardware"], results["yardstick"], results["whole_prefill_s"]
    chunk = next(k for k in results["settings"] if k != "whole")
    run = results["settings"][chunk]
    del run["long_ttft_s"], run["short_ttft_s"]["p90"], run["chunked_prefill_size"]  # the size is in the key
    results["settings"]["chunk_broken"] = {"short_ttft_s": {"mean": 0.1}}  # no percentiles: left out
    text = chunked_section(data)
    cells = table_row(text, f"`{chunk}`")
    assert cells[0] == f"{int(chunk.removeprefix('chunk_')):,}"
    assert cells[2] == "—" and cells[4] == "—" and cells[6] == "—", cells
    assert "chunk_broken" not in text and "Offline yardstick runs" not in text and "yardstick throughput" not in text
    fig = chunked.draw_chunked(data, common.THEMES["light"])
    (ttft,) = fig.axes  # no yardstick: the TTFT bars alone
    assert len(ttft.containers) == 2, "no long-request bars when a setting lacks its long_ttft_s"
    assert fig.texts[0].get_text() == "Chunked prefill"

    results["settings"] = {"whole": results["settings"]["whole"]}  # nothing to compare with
    res = common.BenchmarkResult("benchmarks/results/chunked_x.json", data)
    assert chunked.chunked_section(res) is None and chunked.draw_chunked(data, common.THEMES["light"]) is None
    assert common.render_svgs(chunked.draw_chunked, res) == {}
    assert "short_ttft_s.p99" in "\n".join(common._generic_tables(data)), "the generic tables still show the numbers"
    for results in (None, [], {"settings": []}, {"settings": {"chunk_64": {}}}):
        assert chunked.draw_chunked({"results": results}, common.THEMES["dark"]) is None


def test_chunked_comparison_has_a_row_per_chunk_size() -> None:
    table = chunked.chunked_comparison(plots.load_results(REPO)).splitlines()
    rows = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table[2:]]
    expected = []
    for path in chunked_results():
        data = json.loads(path.read_text(encoding="utf-8"))
        settings = data["results"]["settings"]
        for i, key in enumerate(k for k in settings if k != "whole"):
            expected.append((path.name if i == 0 else "", settings[key]["chunked_prefill_size"],
                             f"{settings['whole']['short_ttft_s']['p99'] * 1e3:,.1f}", ms(settings[key]["short_ttft_s"]["p99"]),
                             _lower_or_higher(settings[key]["p99_ratio_vs_whole"]), data["results"]["yardstick"][key]["vs_whole"]))
    assert len(rows) == len(expected)
    for cells, (name, size, whole, p99, ratio, vs_whole) in zip(rows, expected):
        assert cells[2] == f"{size:,}"
        assert cells[3] == f"{whole} → {p99}"
        assert cells[4] == f"**{ratio}**"
        assert cells[5] == f"{vs_whole:.3f}×"
        assert (f"`{name}`" in cells[6]) if name else (cells[0] == cells[1] == cells[6] == ""), cells


def test_chunked_comparison_without_results() -> None:
    assert "No chunked-prefill results" in chunked.chunked_comparison([])


def test_chunked_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/chunked_x.json", chunked_data())
    svgs = common.render_svgs(chunked.draw_chunked, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


def test_long_nested_values_are_summarised_in_generic_tables() -> None:
    """A per-step trace in a results file is not spelled out on the page; short ones are."""
    trace = [{"schedule": [0.0, 0.3], "launch": [0.3, 7.4]} for _ in range(12)]
    assert common._fmt(trace) == "12 entries (in the results file)"
    assert common._fmt({"a": [1, 2]}) == '`{"a":[1,2]}`'


# --------------------------------------------------------------------------------------------
# overlap: overlap scheduling off and on (results.decode, results.timeline, results.yardstick)
# --------------------------------------------------------------------------------------------

# A CPU run of `python -m benchmarks overlap` (tiny shape, float32) in the newer format: the
# yardstick repeated and interleaved (a run per repeat and setting, a ratio per repeat and their
# median), no device lane and no roofline. Times of the traced steps in ms, rounded.
CPU_TIMELINE = {
    "overlap_off": [
        ((0.000, 0.441), (0.451, 7.155), (7.162, 7.207)),
        ((7.227, 7.720), (7.729, 14.536), (14.542, 14.586)),
        ((14.604, 15.164), (15.174, 22.056), (22.063, 22.106)),
        ((22.124, 22.615), (22.624, 29.192), (29.198, 29.239)),
        ((29.255, 29.810), (29.820, 36.523), (36.529, 36.590)),
        ((36.606, 37.112), (37.122, 43.558), (43.564, 43.603)),
        ((43.618, 44.068), (44.077, 51.154), (51.160, 51.204)),
        ((51.221, 51.719), (51.728, 58.990), (58.997, 59.046)),
        ((59.066, 59.606), (59.618, 67.175), (67.181, 67.227)),
        ((67.247, 67.780), (67.789, 74.939), (74.946, 74.993)),
        ((75.011, 75.511), (75.520, 82.408), (82.414, 82.458)),
        ((82.480, 82.998), (83.007, 89.870), (89.877, 89.920)),
    ],
    "overlap_on": [
        ((0.000, 0.427), (0.434, 6.785), (13.525, 13.561)),
        ((6.844, 7.263), (7.271, 13.521), (20.383, 20.421)),
        ((13.579, 14.008), (14.016, 20.379), (27.243, 27.281)),
        ((20.439, 20.856), (20.864, 27.239), (34.086, 34.124)),
        ((27.301, 27.735), (27.743, 34.082), (40.607, 40.649)),
        ((34.145, 34.566), (34.574, 40.603), (47.781, 47.823)),
        ((40.670, 41.089), (41.096, 47.776), (54.842, 54.884)),
        ((47.847, 48.308), (48.316, 54.837), (61.934, 61.977)),
        ((54.906, 55.374), (55.382, 61.929), (69.139, 69.181)),
        ((61.998, 62.454), (62.462, 69.134), (76.134, 76.176)),
        ((69.205, 69.739), (69.748, 76.128), (83.361, 83.403)),
        ((76.197, 76.728), (76.737, 83.356), (90.588, 90.630)),
    ],
}


def yardstick_run(input_tokens: int, output_tokens: int, time_s: float) -> dict:
    return {"requests": 32, "input_tokens": input_tokens, "output_tokens": output_tokens, "time_s": time_s,
            "output_tok_s": output_tokens / time_s, "kv_pages": 243, "kv_tokens": 3888}


def overlap_cpu() -> dict:
    off = [yardstick_run(1307, 1330, 0.2931), yardstick_run(1241, 1240, 0.2899), yardstick_run(1291, 1340, 0.3113)]
    on = [yardstick_run(1307, 1330, 0.2812), yardstick_run(1241, 1240, 0.2935), yardstick_run(1291, 1340, 0.2812)]
    speedups = [b["output_tok_s"] / a["output_tok_s"] for a, b in zip(off, on)]
    return {
        "benchmark": "overlap",
        "date": "2026-11-21T09:40:04+00:00",
        "commit": "02834d8-dirty",
        "hardware": {"cpu": "x86_64", "cpu_count": 2, "python": "3.11.7", "torch": "2.13.0+cpu"},
        "config": {"shapes": ["tiny"], "device": "cpu", "dtype": "float32", "decode_prompt_len": 128, "decode_tokens": 64,
                   "yardstick_shape": "tiny", "yardstick_requests": 32, "yardstick_len": "16,64", "yardstick_repeats": 3,
                   "ignore_eos": True, "seed": 0, "cpu_threads": 1},
        "results": {
            "copy_bandwidth_bytes_s": None,
            "decode": {"tiny": {"overlap_off": 2.8177, "overlap_on": 2.5789, "speedup": 1.0926, "bytes_per_step": 698496}},
            "timeline": {
                "shape": "tiny", "requests": 32, "prompt_len": 256,
                "steps": {key: [dict(zip(("schedule", "launch", "process"), map(list, step))) for step in steps]
                          for key, steps in CPU_TIMELINE.items()},
            },
            "yardstick": {"overlap_off": off, "overlap_on": on, "speedups": speedups,
                          "speedup": sorted(speedups)[1], "kv_pages": 243},
        },
    }


def overlap_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "overlap")


def overlap_files() -> list[tuple[str, dict]]:
    """The CPU sample above and every committed overlap result (older ones: one yardstick run)."""
    return [("cpu-sample", overlap_cpu())] + [(p.stem, json.loads(p.read_text(encoding="utf-8"))) for p in overlap_results()]


def overlap_section(data: dict, rel: str = "benchmarks/results/overlap_x.json") -> str:
    lines = overlap.overlap_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "an overlap result with a timeline, decode numbers or a yardstick must get its own section"
    return "\n".join(lines)


def period(steps: list[dict]) -> float:
    """ms per traced step: from the first step's schedule to the last one's, over the steps between."""
    return (steps[-1]["schedule"][0] - steps[0]["schedule"][0]) / (len(steps) - 1)


@pytest.mark.parametrize("name,data", overlap_files(), ids=[name for name, _ in overlap_files()])
def test_overlap_timeline_is_drawn_with_a_lane_per_part(name: str, data: dict) -> None:
    steps = data["results"]["timeline"]["steps"]
    device = "device" in steps["overlap_off"][0]
    fig = overlap.draw_overlap(data, common.THEMES["light"])
    off, on = fig.axes
    for ax, key, label in ((off, "overlap_off", "overlap off"), (on, "overlap_on", "overlap on")):
        lanes = [t.get_text() for t in ax.get_yticklabels()]
        assert lanes == ["host: schedule", "host: launch", "host: process"] + (["device"] if device else [])
        assert len(ax.collections) == len(lanes) * len(steps[key]), "one bar per step in every lane"
        assert ax.get_title(loc="left").startswith(f"{label}: {common._number(period(steps[key]), 'ms')} per step")
    launch = [c.get_paths()[0].get_extents() for c in off.collections[len(steps["overlap_off"]):2 * len(steps["overlap_off"])]]
    assert [x for b in launch for x in (b.x0, b.x1)] == pytest.approx([x for s in steps["overlap_off"] for x in s["launch"]])
    assert off.get_shared_x_axes().joined(off, on), "both runs on one time axis"
    assert on.get_xlabel() == "time since the first traced step started (ms)"
    timeline = data["results"]["timeline"]
    workload = f"{timeline['requests']:,} decoding requests with {timeline['prompt_len']:,}-token prompts ({timeline['shape']})"
    assert workload in fig.texts[0].get_text()


@pytest.mark.parametrize("name,data", overlap_files(), ids=[name for name, _ in overlap_files()])
def test_overlap_section_numbers(name: str, data: dict) -> None:
    results = data["results"]
    steps = results["timeline"]["steps"]
    text = overlap_section(data)
    lines = [line for line in text.splitlines() if line]
    ratios = lines[1]
    assert ratios.startswith("Overlap on against off: timeline "), ratios
    assert f"{common._number(period(steps['overlap_off']))} → {common._number(period(steps['overlap_on']), 'ms')} per step" in ratios
    for shape, run in results["decode"].items():
        assert f"**{run['speedup']:.3f}×** ({shape})" in ratios
        cells = table_row(text, shape)
        assert cells[:3] == [common._number(run["overlap_off"], "ms"), common._number(run["overlap_on"], "ms"),
                             f"**{run['speedup']:.3f}×**"]
        assert cells[4:] == ([common._number(run["roofline_ms"], "ms"), f"{run['fraction_of_roofline']:.1%}"]
                             if "roofline_ms" in run else ["—", "—"])
    for key, label in (("overlap_off", "overlap off"), ("overlap_on", "overlap on")):
        cells = table_row(text, label)
        last = steps[key][-1]["process"][1]
        assert cells[:3] == [str(len(steps[key])), f"**{common._number(period(steps[key]), 'ms')}**",
                             common._number(last / len(steps[key]), "ms")]
    assert "Offline yardstick runs" in text
    assert "| copy_bandwidth_bytes_s |" not in text and "entries (in the results file)" not in text, "nothing dumped"


def test_overlap_yardstick_repeats_and_median() -> None:
    data = overlap_cpu()
    yard = data["results"]["yardstick"]
    text = overlap_section(data)
    assert f"offline yardstick **{yard['speedup']:.3f}×** (median of 3 repeats)" in text
    for i, ratio in enumerate(yard["speedups"], 1):
        cells = table_row(text, str(i))
        assert cells[2] == f"{ratio:.3f}×" and cells[3] == "243, 243"
    assert table_row(text, "median")[2] == f"**{yard['speedup']:.3f}×**"
    # Without the ratios in the file: each computed from the runs, the median of them.
    del yard["speedups"], yard["speedup"]
    got = overlap._overlap_yardstick(data)
    expected = [on["output_tok_s"] / off["output_tok_s"] for off, on in zip(yard["overlap_off"], yard["overlap_on"])]
    assert [r for _, _, r in got["pairs"]] == pytest.approx(expected)
    assert got["median"] == pytest.approx(sorted(expected)[1])


def test_overlap_old_yardstick_format() -> None:
    """Older files: one run per setting (a dict, not a list) and ``speedup``, no ``speedups``."""
    data = overlap_cpu()
    yard = data["results"]["yardstick"]
    old = {"overlap_off": yard["overlap_off"][0], "overlap_on": yard["overlap_on"][0], "speedup": 1.099}
    data["results"]["yardstick"] = old
    text = overlap_section(data)
    assert "offline yardstick **1.099×** (one run)" in text
    assert table_row(text, "1")[2] == "**1.099×**"
    assert "| median |" not in text
    del old["speedup"]
    assert overlap._overlap_yardstick(data)["median"] == pytest.approx(
        old["overlap_on"]["output_tok_s"] / old["overlap_off"]["output_tok_s"])


def test_overlap_file_with_missing_keys_still_draws() -> None:
    data = overlap_cpu()
    results = data["results"]
    del data["config"], data["hardware"], results["yardstick"], results["decode"]["tiny"]["speedup"]
    steps = results["timeline"]["steps"]
    del steps["overlap_on"][3]["launch"]  # a lane missing in one step: that bar is left out
    steps["overlap_on"][4]["process"] = [5.0]  # a malformed span too
    steps["overlap_off"].append("not a step")
    text = overlap_section(data)
    run = results["decode"]["tiny"]
    assert table_row(text, "tiny")[2] == f"**{run['overlap_off'] / run['overlap_on']:.3f}×**"
    assert "yardstick" not in text
    fig = overlap.draw_overlap(data, common.THEMES["dark"])
    off, on = fig.axes
    assert len(off.collections) == 3 * 12 and len(on.collections) == 3 * 12 - 2
    assert fig.texts[0].get_text() == "Overlap scheduling: 32 decoding requests with 256-token prompts (tiny)"

    del results["timeline"]["steps"]["overlap_on"]  # no timeline to draw: the tables alone
    res = common.BenchmarkResult("benchmarks/results/overlap_x.json", data)
    assert overlap.draw_overlap(data, common.THEMES["light"]) is None and common.render_svgs(overlap.draw_overlap, res) == {}
    text = overlap_section(data)
    assert "Decode at batch size 1" in text and "Each bar is one part" not in text
    del results["decode"]  # nothing this view knows: the generic tables
    assert overlap.overlap_section(res) is None
    assert "timeline" in "\n".join(common._generic_tables(data))
    for results in (None, [], {"timeline": []}, {"timeline": {"steps": {"overlap_off": [{}], "overlap_on": [1]}}},
                    {"decode": {"tiny": {"overlap_off": 1.0}}}, {"yardstick": {"overlap_off": 3}}):
        assert overlap.draw_overlap({"results": results}, common.THEMES["dark"]) is None
        assert overlap.overlap_section(common.BenchmarkResult("benchmarks/results/overlap_x.json", {"results": results})) is None


def test_overlap_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/overlap_x.json", overlap_cpu())
    svgs = common.render_svgs(overlap.draw_overlap, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# --------------------------------------------------------------------------------------------
# host: host time per decode step (results.scheduler, results.bs1_profile)
# --------------------------------------------------------------------------------------------


def scheduler_run(prompt_len: int, schedule_ms: float, process_ms: float) -> dict:
    return {"requests": 32, "prompt_len": prompt_len, "new_tokens": 48, "decode_steps": 43,
            "schedule_ms": schedule_ms, "process_ms": process_ms}


PROFILE_ROWS = [  # (what, ms per step, calls per step): a CPU run, tiny shape
    ("scheduler: schedule", 0.34484, 1.0167),
    ("scheduler: process", 0.016487, 1.0),
    ("engine: launch (everything below)", 2.9586, 1.0),
    ("  plan attention", 0.49213, 1.0),
    ("  copy inputs (pinned staging)", 0.088764, 1.0),
    ("  model forward (everything below)", 2.2664, 1.0),
    ("    linear layers", 0.20990, 13.0),
    ("    RMSNorm (plain and fused add)", 0.83531, 19.0),
    ("    RoPE", 0.30166, 3.0),
    ("    attention (KV append + kernel)", 0.67805, 3.0),
    ("    SiLU-and-mul (MLP glue)", 0.019084, 3.0),
    ("  sampler", 0.016145, 1.0),
]


def host_cpu(compare: bool = False) -> dict:
    """A CPU run of `python -m benchmarks host` (tiny shape); with ``compare``, a second load
    and an older tree measured in the same run (synchronous only), as ``--compare-with`` adds."""
    this = {"tree": "/work/main", "32x256": {"overlap_off": scheduler_run(256, 0.55229, 0.038413),
                                             "overlap_on": scheduler_run(256, 0.54859, 0.040877)}}
    scheduler = {"this tree": this}
    if compare:
        this["32x1024"] = {"overlap_off": scheduler_run(1024, 0.71, 0.04), "overlap_on": scheduler_run(1024, 0.70, 0.05)}
        scheduler["compare: /tmp/minisgl-old"] = {"tree": "/tmp/minisgl-old", "32x256": {"synchronous": scheduler_run(256, 1.2, 0.3)},
                                                  "32x1024": {"synchronous": scheduler_run(1024, 1.5, 0.3)}}
    return {
        "benchmark": "host",
        "date": "2026-11-21T09:39:52+00:00",
        "commit": "02834d8-dirty",
        "hardware": {"cpu": "x86_64", "cpu_count": 2, "python": "3.11.7", "torch": "2.13.0+cpu"},
        "config": {"shape": "tiny", "device": "cpu", "dtype": "float32", "loads": "32x256", "new_tokens": 48,
                   "profile_tokens": 60, "compare_with": "/tmp/minisgl-old" if compare else None, "cpu_threads": 1},
        "results": {
            "scheduler": scheduler,
            "bs1_profile": {
                "tokens": 60,
                "profiled_ms_per_step": 3.3665,
                "rows": [{"what": w, "ms_per_step": ms, "calls_per_step": calls} for w, ms, calls in PROFILE_ROWS],
                "unprofiled_ms_per_token": 2.6255,
            },
        },
    }


def host_section(data: dict, rel: str = "benchmarks/results/host_x.json") -> str:
    lines = host.host_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "a host result with scheduler numbers or a profile must get its own section"
    return "\n".join(lines)


@pytest.mark.parametrize("compare", [False, True], ids=["this-tree", "compared"])
def test_host_scheduler_bars_and_table(compare: bool) -> None:
    data = host_cpu(compare)
    scheduler = data["results"]["scheduler"]
    runs = [(tree, load, setting, run) for tree, loads in scheduler.items() for load, settings in loads.items()
            if load != "tree" for setting, run in settings.items()]
    text = host_section(data)
    for tree, load, setting, run in runs:
        total = run["schedule_ms"] + run["process_ms"]
        requests, prompt = load.split("x")
        assert f"**{common._number(total, 'ms')}** ({host._host_series_label(tree, setting)})" in text.splitlines()[2]
        shown = tree if tree.startswith("compare: ") else f"{tree} (`{scheduler[tree]['tree']}`)"  # a path only once
        start = f"| {shown} | {int(requests):,} × {int(prompt):,} | {setting.replace('_', ' ')} |"
        row = next(r for r in text.splitlines() if r.startswith(start))
        times = (common._number(run["schedule_ms"], "ms"), common._number(run["process_ms"], "ms"), common._number(total, "ms"))
        assert row.endswith("| 43 | {} | {} | **{}** |".format(*times))

    fig = host.draw_host(data, common.THEMES["light"])
    bars = fig.subfigs[0].axes[0]
    assert len(bars.patches) == 2 * len(runs), "schedule and process stacked, one bar per tree, load and setting"
    assert sorted(p.get_height() for p in bars.patches) == pytest.approx(
        sorted(v for *_, run in runs for v in (run["schedule_ms"], run["process_ms"])))
    assert sorted(t.get_text() for t in bars.texts) == sorted(common._number(run["schedule_ms"] + run["process_ms"]) for *_, run in runs)
    legend = [t.get_text() for t in bars.get_legend().get_texts()]
    assert "this tree, overlap off" in legend and "this tree, overlap on" in legend
    assert ("compare: minisgl-old, synchronous" in legend) == compare
    assert [t.get_text() for t in bars.get_xticklabels()] == (["32 × 256", "32 × 1,024"] if compare else ["32 × 256"])


def test_host_profile_keeps_the_nesting() -> None:
    data = host_cpu()
    text = host_section(data)
    assert table_row(text, "**scheduler: schedule**")[:2] == [common._number(0.34484, "ms"), common._number(1.0167)]
    assert table_row(text, "&nbsp;" * 6 + "└ plan attention")[0] == common._number(0.49213, "ms")
    assert table_row(text, "&nbsp;" * 12 + "└ RMSNorm (plain and fused add)") == [
        common._number(0.83531, "ms"), "19", f"{0.83531 / 3.3665:.1%}"]
    assert table_row(text, "whole step, profiled")[0] == "**3.37 ms**"
    assert table_row(text, "whole step, not profiled (ms per token)")[0] == "**2.63 ms**"

    fig = host.draw_host(data, common.THEMES["dark"])
    labels_ax, bars = fig.subfigs[1].axes
    assert [p.get_width() for p in bars.patches] == pytest.approx([3.3665, 2.6255] + [ms for _, ms, _ in PROFILE_ROWS])
    labels = [(t.get_text(), t.get_position()[0]) for t in labels_ax.texts]
    wholes = ["whole step, profiled", "whole step, not profiled"]
    assert [name for name, _ in labels] == wholes + [w.strip() for w, _, _ in PROFILE_ROWS]
    x = {name: pos for name, pos in labels}
    assert x["scheduler: schedule"] < x["plan attention"] < x["RoPE"], "nested parts are indented"
    assert x["plan attention"] == x["sampler"]


def test_host_file_with_missing_keys_still_draws() -> None:
    data = host_cpu(compare=True)
    results = data["results"]
    del data["config"], data["hardware"]
    del results["scheduler"]["this tree"]["32x256"]["overlap_on"]["process_ms"]  # left out
    del results["scheduler"]["compare: /tmp/minisgl-old"]["tree"]
    results["scheduler"]["broken"] = [1, 2]
    results["bs1_profile"]["rows"] += [{"what": "no time"}, "not a row"]
    del results["bs1_profile"]["profiled_ms_per_step"]
    text = host_section(data)
    assert "| compare: /tmp/minisgl-old | 32 × 256 | synchronous |" in text
    assert "no time" not in text and "whole step, profiled" not in text
    fig = host.draw_host(data, common.THEMES["light"])
    assert len(fig.subfigs[0].axes[0].patches) == 2 * 5
    assert len(fig.subfigs[1].axes[1].patches) == 1 + len(PROFILE_ROWS), "the whole step not profiled, then the parts"
    assert fig.texts[0].get_text() == "Host time per decode step"

    del results["bs1_profile"]  # the scheduler bars alone
    fig = host.draw_host(data, common.THEMES["light"])
    assert not fig.subfigs and len(fig.axes) == 1
    data = host_cpu()
    del data["results"]["scheduler"]  # the profile alone
    assert len(host.draw_host(data, common.THEMES["light"]).axes) == 2
    assert "Scheduler host time" not in host_section(data)

    data["results"]["bs1_profile"]["rows"] = []  # nothing this view knows: the generic tables
    res = common.BenchmarkResult("benchmarks/results/host_x.json", data)
    assert host.host_section(res) is None and common.render_svgs(host.draw_host, res) == {}
    assert "bs1_profile" in "\n".join(common._generic_tables(data))
    for results in (None, [], {"scheduler": []}, {"scheduler": {"this tree": {"32x256": {"overlap_on": {"schedule_ms": 1}}}}},
                    {"bs1_profile": {"rows": {}}}):
        assert host.draw_host({"results": results}, common.THEMES["dark"]) is None
        assert host.host_section(common.BenchmarkResult("benchmarks/results/host_x.json", {"results": results})) is None


def test_host_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/host_x.json", host_cpu(compare=True))
    svgs = common.render_svgs(host.draw_host, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# --------------------------------------------------------------------------------------------
# The drawing of the CUDA-graphs benchmark (graphs_*.json), without a site build
# --------------------------------------------------------------------------------------------


def kernel_profile(kinds: dict[str, tuple[float, float]]) -> dict:
    """A ``kernels_*`` profile as the benchmark writes it: ``{kind: (kernels per step, µs per step)}``."""
    return {"steps": 20, "kernels_per_step": sum(n for n, _ in kinds.values()),
            "by_kind": {kind: {"kernels_per_step": n, "us_per_step": us} for kind, (n, us) in kinds.items()}}


# A made-up GPU run of `python -m benchmarks graphs` with round numbers: two shapes, the
# kernels of a step with graphs off and on and on an older tree, the yardstick repeated 3 times.
GRAPHS_KERNELS = {
    "a": {"eager": {"matmul": (100, 800.0), "copy": (90, 90.0), "attention": (20, 100.0)},
          "graphs_off": {"matmul": (100, 800.0), "copy": (10, 20.0), "attention": (20, 100.0)},
          "graphs_on": {"matmul": (100, 810.0), "copy": (10, 20.0), "attention": (40, 170.0)}},
    "b": {"eager": {"matmul": (200, 4000.0), "copy": (100, 100.0), "attention": (30, 200.0), "sampling": (1, 25.0)},
          "graphs_off": {"matmul": (200, 4000.0), "copy": (20, 25.0), "attention": (30, 200.0), "sampling": (1, 25.0)},
          "graphs_on": {"matmul": (200, 4000.0), "copy": (20, 25.0), "attention": (60, 400.0), "sampling": (1, 25.0)}},
}


def repeated_yardstick(off_key: str, on_key: str) -> dict:
    """A made-up yardstick of two settings repeated 3 times: ratios 1.5, 1.6, 1.4 (median 1.5)."""
    def run(tok_s: float) -> dict:
        return {"requests": 256, "input_tokens": 1000, "output_tokens": 2000, "time_s": 2000 / tok_s,
                "output_tok_s": tok_s, "kv_pages": 500, "kv_tokens": 8000}

    off, on = [run(10000.0), run(9000.0), run(11000.0)], [run(15000.0), run(14400.0), run(15400.0)]
    speedups = [b["output_tok_s"] / a["output_tok_s"] for a, b in zip(off, on)]
    return {off_key: off, on_key: on, "speedups": speedups, "speedup": sorted(speedups)[1], "kv_pages": 500}


def graphs_sample() -> dict:
    decode = {}
    for shape, (ms_off, ms_on, roofline, memory) in {"a": (5.0, 2.0, 0.5, 3 * 2**29), "b": (8.0, 6.4, 4.8, 512 * 2**20)}.items():
        decode[shape] = {
            "graphs_off": ms_off, "kernels_graphs_off": kernel_profile(GRAPHS_KERNELS[shape]["graphs_off"]),
            "startup_s_with_capture": 1.25, "graph_memory_bytes": memory, "buckets": [1, 2, 4, 8],
            "graphs_on": ms_on, "kernels_graphs_on": kernel_profile(GRAPHS_KERNELS[shape]["graphs_on"]),
            "speedup": ms_off / ms_on, "bytes_per_step": roofline * 4e9, "roofline_ms": roofline,
            "fraction_of_roofline": roofline / ms_on,
        }
    return {
        "benchmark": "graphs",
        "date": "2026-11-21T10:04:47+00:00",
        "commit": "0000000",
        "hardware": {"gpu": "NVIDIA H200", "gpu_count": 1},
        "config": {"shapes": ["a", "b"], "device": "cuda", "dtype": "bfloat16", "decode_prompt_len": 128,
                   "decode_tokens": 256, "graph_max_bs": 256, "yardstick_shape": "a", "yardstick_requests": 256,
                   "yardstick_len": "100,1024", "yardstick_repeats": 3, "compare_kernels_with": ".trees/old", "overlap": True},
        "results": {
            "copy_bandwidth_bytes_s": 4e12,
            "decode": decode,
            "kernels_compared_tree": {"tree": ".trees/old",
                                      "eager": {shape: kernel_profile(k["eager"]) for shape, k in GRAPHS_KERNELS.items()}},
            "yardstick": repeated_yardstick("graphs_off", "graphs_on"),
        },
    }


def graphs_section(data: dict, rel: str = "benchmarks/results/graphs_x.json") -> str:
    lines = graphs.graphs_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "a graphs result with decode numbers, kernels or a yardstick must get its own section"
    return "\n".join(lines)


def graphs_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json")
                  if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "graphs")


def test_there_are_graphs_results_to_draw() -> None:
    assert graphs_results(), "benchmarks/results/ has no graphs result to draw"


def test_graphs_section_numbers() -> None:
    data = graphs_sample()
    text = graphs_section(data)
    lines = [line for line in text.splitlines() if line]
    assert lines[0].startswith("cuda · bfloat16 · batch-size-1 decode: 256 tokens after a 128-token prompt · "
                               "offline yardstick: 256 requests, input and output lengths 100–1,024 tokens (a)")
    assert lines[1] == ("CUDA graphs on against off: batch-size-1 decode **2.500×** (a), **1.250×** (b); offline yardstick "
                        "**1.500×** (median of 3 repeats). Kernels per eager decode step, `old` → this tree: "
                        "**210 → 130** (a), **331 → 251** (b).")
    # batch-size-1 decode against the roofline, then the captured graphs
    assert table_row(text, "a") == ["5 ms", "2 ms", "**2.500×**", "2 GB", "0.5 ms", "25.0%"]
    assert table_row(text, "b") == ["8 ms", "6.4 ms", "**1.250×**", "19.2 GB", "4.8 ms", "75.0%"]
    assert "| shape | graphs off | graphs on | speed-up with graphs |" in text
    assert "(4 TB/s); the share is the roofline over the time with graphs on." in text
    assert table_row(text, "a", "| shape | captured batch sizes | graph memory | start-up with capture |") == [
        "1, 2, 4, 8", "1.5 GiB", "1.25 s"]
    assert table_row(text, "b", "| shape | captured batch sizes | graph memory | start-up with capture |")[1] == "512 MiB"
    # kernels by kind, most device time first, a column per profiled step
    assert "| kind | old, eager | this tree, graphs off | this tree, graphs on |" in text
    assert table_row(text, "copy", "_a_") == ["90 · 90 µs", "10 · 20 µs", "10 · 20 µs"]
    assert table_row(text, "attention", "_a_") == ["20 · 100 µs", "20 · 100 µs", "40 · 170 µs"]
    assert table_row(text, "all kernels", "_a_") == ["**210 · 990 µs**", "**130 · 920 µs**", "**150 · 1,000 µs**"]
    assert table_row(text, "kernel time, share of the ms per token", "_a_") == ["—", "18% of 5 ms", "50% of 2 ms"]
    assert table_row(text, "sampling", "_b_") == ["1 · 25 µs"] * 3
    assert table_row(text, "all kernels", "_b_")[2] == "**281 · 4,450 µs**"
    table_b = text.split("_b_")[1].split("| all kernels |")[0].splitlines()
    kinds = [line.split("|")[1].strip() for line in table_b if line.startswith("| ")][1:]  # after the header
    assert kinds == ["matmul", "attention", "copy", "sampling"], "the kinds in order of device time over every profile"
    assert "`.trees/old`: the tree whose eager decode step was profiled in the same run" in text
    # the yardstick's repeats and their median
    yard = data["results"]["yardstick"]
    for i, ratio in enumerate(yard["speedups"], 1):
        assert table_row(text, str(i))[2] == f"{ratio:.3f}×"
    assert table_row(text, "median")[2] == "**1.500×**"
    assert "| repeat | graphs off | graphs on | on / off | KV pages (off, on) |" in text
    assert "| graphs on | 3 | 256 |" in text, "every run in the fold-out table"
    assert "copy_bandwidth_bytes_s" not in text and "entries (in the results file)" not in text, "nothing dumped"


def test_graphs_plot_bars() -> None:
    data = graphs_sample()
    fig = graphs.draw_graphs(data, common.THEMES["light"])
    decode, kernels = fig.subfigs
    assert fig.texts[0].get_text() == "CUDA graphs off and on on NVIDIA H200"
    for ax, (shape, run) in zip(decode.axes, data["results"]["decode"].items()):
        assert ax.get_title(loc="left") == f"{shape}: decode at batch size 1"
        assert [t.get_text() for t in ax.get_yticklabels()] == ["graphs off (eager)", "graphs on", "HBM roofline"]
        assert [p.get_width() for p in ax.patches] == pytest.approx([run["graphs_off"], run["graphs_on"], run["roofline_ms"]])
        labels = [t.get_text() for t in ax.texts]
        assert labels[1].endswith(f"→  {common._number(run['speedup'])}× faster")
        assert labels[2].endswith(f"(graphs on reach {run['fraction_of_roofline']:.0%} of it)")
    assert decode.axes[0].get_shared_x_axes().joined(*decode.axes), "both shapes on one time axis"
    order = ["matmul", "attention", "copy", "sampling"]
    for ax, (_shape, profiles) in zip(kernels.axes, GRAPHS_KERNELS.items()):
        assert [t.get_text() for t in ax.get_yticklabels()] == ["old, eager", "this tree, graphs off", "this tree, graphs on"]
        expected = [profiles[key][kind][1] for key in ("eager", "graphs_off", "graphs_on") for kind in order if kind in profiles[key]]
        assert [p.get_width() for p in ax.patches] == pytest.approx(expected), "µs per kind, stacked in one order"
        totals = [(sum(n for n, _ in profiles[key].values()), sum(us for _, us in profiles[key].values()))
                  for key in ("eager", "graphs_off", "graphs_on")]
        assert [t.get_text() for t in ax.texts] == [f"{n} kernels, {common._number(us, 'µs')}" for n, us in totals]
    assert [t.get_text() for t in kernels.legends[0].get_texts()] == order


@pytest.mark.parametrize("path", graphs_results(), ids=lambda p: p.stem)
def test_graphs_committed_results(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    results = data["results"]
    text = graphs_section(data, path.relative_to(REPO).as_posix())
    for shape, run in results["decode"].items():
        cells = table_row(text, shape)
        assert cells[:3] == [common._number(run["graphs_off"], "ms"), common._number(run["graphs_on"], "ms"),
                             f"**{run['speedup']:.3f}×**"]
        if "roofline_ms" in run:
            assert cells[4:] == [common._number(run["roofline_ms"], "ms"), f"{run['fraction_of_roofline']:.1%}"]
        assert f"**{run['speedup']:.3f}×** ({shape})" in text.splitlines()[2]
        if "kernels_graphs_on" in run:
            on = run["kernels_graphs_on"]
            total = sum(k["us_per_step"] for k in on["by_kind"].values())
            assert table_row(text, "all kernels", f"_{shape}_")[-1] == f"**{common._number(on['kernels_per_step'])} · {common._number(total, 'µs')}**"
    yard = results.get("yardstick")
    if yard and len(yard.get("speedups", [])) != 1:
        assert table_row(text, "median")[2] == f"**{yard['speedup']:.3f}×**"
    elif yard:  # one repeat (python -m benchmarks all): its ratio is the result, no median row
        assert "| median |" not in text and f"offline yardstick **{yard['speedup']:.3f}×** (one run)" in text
    timeline = results.get("bs1_timeline", {})
    head = f"**Where a bs=1 step's time goes with graphs** ({timeline.get('shape')}), one row per fresh process, ms:"
    for i, run in enumerate(timeline.get("processes", [])):
        row = table_row(text, str(i), head)  # ms/token, graph alone, served, between, host lead, behind, cycle
        assert row[:7] == [f"{run['ms_per_token']:.2f}", f"{run['replay_alone_ms']:.2f}", f"{run['replays']['graph_ms']:.2f}",
                            f"{run['replays']['between_ms']:.2f}", f"{run['replays']['host_lead_ms']:.2f}",
                            f"{run['replays']['host_behind_fraction']:.0%}", f"{run['host_ms']['cycle']:.2f}"]
    assert "entries (in the results file)" not in text and "| copy_bandwidth_bytes_s |" not in text, "nothing dumped"
    fig = graphs.draw_graphs(data, common.THEMES["dark"])
    shapes = len(results["decode"])
    kernels = graphs._graphs_kernels(data)
    assert len(fig.axes) == shapes + (len(kernels) if kernels else 0)


def test_graphs_file_with_missing_keys_still_draws() -> None:
    """A CPU run (no kernels, no roofline), no compared tree, no yardstick: what is there is drawn."""
    data = graphs_sample()
    results = data["results"]
    del data["config"], data["hardware"], results["kernels_compared_tree"]
    results["copy_bandwidth_bytes_s"] = None
    for run in results["decode"].values():
        for key in ("kernels_graphs_off", "kernels_graphs_on", "roofline_ms", "fraction_of_roofline", "speedup"):
            del run[key]
    del results["decode"]["b"]["buckets"]
    text = graphs_section(data)
    assert table_row(text, "a")[2:] == ["**2.500×**", "2 GB", "—", "—"]
    assert "No roofline: the run measured no device copy bandwidth." in text
    assert table_row(text, "b", "| shape | captured batch sizes | graph memory | start-up with capture |")[0] == "—"
    assert "Kernels of one decode step" not in text and "Kernels per eager decode step" not in text
    fig = graphs.draw_graphs(data, common.THEMES["light"])
    assert not fig.subfigs and len(fig.axes) == 2, "the decode panels alone"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["graphs off (eager)", "graphs on"]
    assert fig.texts[0].get_text() == "CUDA graphs off and on"

    data = graphs_sample()  # kernels without the compared tree: this tree's two columns
    del data["results"]["kernels_compared_tree"]["eager"]["a"]
    text = graphs_section(data)
    assert "| kind | this tree, graphs off | this tree, graphs on |" in text
    assert "Kernels per eager decode step, `old` → this tree: **331 → 251** (b)." in text
    del data["results"]["decode"]  # the kernels of the compared tree alone, and the yardstick
    text = graphs_section(data)
    assert "| kind | old, eager |" in text and "Decode at batch size 1" not in text
    assert len(graphs.draw_graphs(data, common.THEMES["light"]).axes) == 1

    data = {"benchmark": "graphs", "results": {"yardstick": graphs_sample()["results"]["yardstick"]}}
    res = common.BenchmarkResult("benchmarks/results/graphs_x.json", data)
    assert graphs.draw_graphs(data, common.THEMES["light"]) is None and common.render_svgs(graphs.draw_graphs, res) == {}
    assert "median" in graphs_section(data) and "![" not in graphs_section(data), "the yardstick alone, no plot"
    for results in (None, [], {"decode": []}, {"decode": {"a": {"graphs_off": 1.0}}}, {"yardstick": {"graphs_off": 3}},
                    {"kernels_compared_tree": {"eager": {"a": {"by_kind": {"x": {"kernels_per_step": 1}}}}}}):
        assert graphs.draw_graphs({"results": results}, common.THEMES["dark"]) is None
        assert graphs.graphs_section(common.BenchmarkResult("benchmarks/results/graphs_x.json", {"results": results})) is None


def test_graphs_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/graphs_x.json", graphs_sample())
    svgs = common.render_svgs(graphs.draw_graphs, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# --------------------------------------------------------------------------------------------
# The drawing of the tensor-parallel benchmark (tp_*.json), without a site build
# --------------------------------------------------------------------------------------------

# A made-up GPU run of `python -m benchmarks tp --profile` with round numbers: the kernels of
# one decode step of TP=1, TP=2 and TP=2 with every all-reduce through NCCL.
TP_KERNELS = {
    "tp1": {"matmul": (200, 4000.0), "attention": (32, 300.0), "other": (1, 2.0)},
    "tp2": {"matmul": (200, 2000.0), "all-reduce (symmetric memory)": (65, 450.0), "attention": (32, 300.0),
            "other": (66, 66.0)},
    "tp2_nccl": {"matmul": (200, 2000.0), "all-reduce / all-gather (NCCL)": (66, 460.0), "attention": (32, 300.0),
                 "other": (1, 2.0)},
}
TP_TRACE_HEAD = "| | ms per step | output tok/s | steps vs TP=1 | schedule | launch | process | device |"
TP_ALL_REDUCE_HEAD = ("| batch size | message | NCCL, eager | NCCL in a CUDA graph | symmetric memory, eager "
                      "| symmetric memory in a CUDA graph |")


def tp_trace(period_ms: float) -> dict:
    steps = [{"schedule": [i * period_ms, i * period_ms + 0.5], "launch": [i * period_ms + 0.5, i * period_ms + 1.5],
              "process": [i * period_ms + 1.5, i * period_ms + 1.5 + period_ms], "device": [i * period_ms + 1, (i + 1) * period_ms + 1]}
             for i in range(12)]
    return {"summary": {"period_ms": period_ms, "schedule_ms": 0.5, "launch_ms": 1.0, "process_ms": period_ms - 1.0,
                        "device_ms": period_ms}, "steps": steps}


def tp_sample() -> dict:
    return {
        "benchmark": "tp",
        "date": "2026-11-21T12:19:38+00:00",
        "commit": "0000000",
        "hardware": {"gpu": "NVIDIA H200", "gpu_count": 2},
        "config": {"shape": "llama-3.1-8b", "tp": 2, "device": "cuda", "dtype": "bfloat16", "decode_prompt_len": 128,
                   "decode_tokens": 256, "graph_max_bs": 256, "yardstick_requests": 256, "yardstick_len": "100,1024",
                   "yardstick_repeats": 3, "profile": True, "trace_batch": 128, "comm_backend": "nccl"},
        "results": {
            "copy_bandwidth_bytes_s": 4e12,
            "decode": {
                "tp1": {"bytes_per_rank_per_step": 16e9, "graphs_off": 6.0, "graphs_on": 5.0, "roofline_ms": 4.0,
                        "fraction_of_roofline": 0.8},
                "tp2": {"bytes_per_rank_per_step": 8e9, "graphs_off": 8.0, "graphs_on": 4.0, "graphs_on_nccl": 4.4,
                        "roofline_ms": 2.0, "fraction_of_roofline": 0.5},
            },
            "decode_speedup": 1.25,
            "kernels_per_decode_step": {key: kernel_profile(kinds) for key, kinds in TP_KERNELS.items()},
            "decode_trace": {"batch": 128, "tp1": tp_trace(8.0), "tp2": tp_trace(5.0), "tp2_nccl": tp_trace(6.4)},
            "collectives_per_decode_step": {"all_reduce": 65, "all_gather": 1},
            "all_reduce": [
                {"batch_size": 1, "bytes": 8192, "eager_us": 20.0, "graph_us": 30.0, "symmetric_eager_us": 14.0,
                 "symmetric_graph_us": 7.0},
                {"batch_size": 512, "bytes": 4 << 20, "eager_us": 32.0, "graph_us": 57.0, "symmetric_eager_us": 35.0,
                 "symmetric_graph_us": 33.0},
                {"batch_size": 1024, "bytes": 8 << 20, "eager_us": 46.0, "graph_us": 71.0},
            ],
            "yardstick": repeated_yardstick("tp1", "tp2"),
        },
    }


def tp_cpu() -> dict:
    """A CPU run of `python -m benchmarks tp --shape tiny --device cpu --decode-tokens 16
    --yardstick-requests 8 --yardstick-len 16,32 --yardstick-repeats 1` (gloo, two rank
    processes), trimmed to 4 all-reduce sizes: no graphs, no roofline, no profiles or traces, no
    symmetric memory, one yardstick run."""
    def run(time_s: float) -> dict:
        return {"requests": 8, "input_tokens": 214, "output_tokens": 196, "time_s": time_s, "output_tok_s": 196 / time_s,
                "kv_pages": 93, "kv_tokens": 1488}

    return {
        "benchmark": "tp",
        "date": "2026-11-21T12:40:00+00:00",
        "commit": "1e83e5e",
        "hardware": {"cpu": "x86_64", "cpu_count": 2, "python": "3.12.3", "torch": "2.11.0+cpu"},
        "config": {"shape": "tiny-qwen3", "tp": 2, "device": "cpu", "dtype": "float32", "decode_prompt_len": 128,
                   "decode_tokens": 16, "graph_max_bs": 0, "yardstick_requests": 8, "yardstick_len": "16,32",
                   "yardstick_repeats": 1, "profile": False, "trace_batch": 128, "comm_backend": "gloo"},
        "results": {
            "copy_bandwidth_bytes_s": None,
            "decode": {"tp1": {"bytes_per_rank_per_step": 680064, "graphs_off": 4.06},
                       "tp2": {"bytes_per_rank_per_step": 340032, "graphs_off": 17.4}},
            "decode_speedup": 4.06 / 17.4,
            "collectives_per_decode_step": {"all_reduce": 7, "all_gather": 1},
            "all_reduce": [{"batch_size": 1, "bytes": 256, "eager_us": 1027.3}, {"batch_size": 2, "bytes": 512, "eager_us": 1372.6},
                           {"batch_size": 2048, "bytes": 524288, "eager_us": 3354.8},
                           {"batch_size": 8192, "bytes": 2097152, "eager_us": 4956.1}],
            "yardstick": {"tp1": [run(0.3778)], "tp2": [run(0.9789)], "speedups": [0.3778 / 0.9789],
                          "speedup": 0.3778 / 0.9789, "kv_pages": 93},
        },
    }


def tp_section(data: dict, rel: str = "benchmarks/results/tp_x.json") -> str:
    lines = tp.tp_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "a tp result with decode numbers, kernels, all-reduces, a trace or a yardstick must get its own section"
    return "\n".join(lines)


def tp_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "tp")


def nothing_dumped(text: str) -> bool:
    """No key of the results printed as such, no per-step trace summarised as a count."""
    return not any(k in text for k in ("copy_bandwidth_bytes_s", "decode_speedup", "collectives_per_decode_step",
                                       "entries (in the results file)", "period_ms"))


def test_there_are_tp_results_to_draw() -> None:
    assert tp_results(), "benchmarks/results/ has no tp result to draw"


def test_tp_section_numbers() -> None:
    text = tp_section(tp_sample())
    lines = [line for line in text.splitlines() if line]
    assert lines[0] == ("**llama-3.1-8b** · cuda · bfloat16 · TP=2 against TP=1 over nccl · batch-size-1 decode: 256 tokens "
                        "after a 128-token prompt · offline yardstick: 256 requests, input and output lengths 100–1,024 tokens")
    assert lines[1] == ("TP=2 against TP=1: batch-size-1 decode **1.250×** (graphs on); decode steps of 128 requests "
                        "**1.600×**; offline yardstick **1.500×** (median of 3 repeats).")
    # batch-size-1 decode: a row per TP size, then TP=2's speed-up in each setting
    assert ("| | graphs off (eager) | graphs on | graphs on, NCCL all-reduce | bytes read per rank per step | roofline "
            "| share of the roofline |") in text
    assert table_row(text, "TP=1") == ["6 ms", "5 ms", "—", "16 GB", "4 ms", "80.0%"]
    assert table_row(text, "TP=2") == ["8 ms", "4 ms", "4.4 ms", "8 GB", "2 ms", "50.0%"]
    assert table_row(text, "TP=2 speed-up over TP=1") == ["0.750×", "**1.250×**", "—", "", "", ""]
    assert "(4 TB/s); the share is the roofline over the time with graphs on." in text
    assert "NCCL all-reduce: every all-reduce through `torch.distributed`" in text
    # kernels by kind: a column per engine, the share of its ms per token
    assert "| kind | TP=1 | TP=2 | TP=2, NCCL all-reduce |" in text
    assert table_row(text, "all-reduce (symmetric memory)") == ["—", "65 · 450 µs", "—"]
    assert table_row(text, "all-reduce / all-gather (NCCL)") == ["—", "—", "66 · 460 µs"]
    assert table_row(text, "all kernels") == ["**233 · 4,302 µs**", "**363 · 2,816 µs**", "**299 · 2,762 µs**"]
    assert table_row(text, "kernel time, share of the ms per token") == ["86% of 5 ms", "70% of 4 ms", "63% of 4.4 ms"]
    # the all-reduce: a row per message size, the fastest way in bold
    assert table_row(text, "1", TP_ALL_REDUCE_HEAD) == ["8 KiB", "20 µs", "30 µs", "14 µs", "**7 µs**"]
    assert table_row(text, "512", TP_ALL_REDUCE_HEAD) == ["4 MiB", "**32 µs**", "57 µs", "35 µs", "33 µs"]
    assert table_row(text, "1024", TP_ALL_REDUCE_HEAD) == ["8 MiB", "**46 µs**", "71 µs", "—", "—"]
    assert "A decode step calls 65 × all-reduce and 1 × all-gather." in text
    # the traced decode steps of 128 requests
    assert "**Decode steps of 128 requests**, traced, mean ms per step:" in text
    assert table_row(text, "TP=1", TP_TRACE_HEAD) == ["**8 ms**", "16,000", "1.000×", "0.5 ms", "1 ms", "7 ms", "8 ms"]
    assert table_row(text, "TP=2", TP_TRACE_HEAD)[:3] == ["**5 ms**", "25,600", "1.600×"]
    assert table_row(text, "TP=2, NCCL all-reduce", TP_TRACE_HEAD)[:3] == ["**6.4 ms**", "20,000", "1.250×"]
    # the yardstick's repeats and their median
    yard_head = "| repeat | TP=1 | TP=2 | TP=2 / TP=1 | KV pages (TP=1, TP=2) |"
    assert [table_row(text, str(i), yard_head)[2] for i in (1, 2, 3)] == ["1.500×", "1.600×", "1.400×"]
    assert table_row(text, "median")[2] == "**1.500×**"
    assert "| TP=2 | 3 | 256 |" in text, "every run in the fold-out table"
    assert nothing_dumped(text)


def test_tp_plot() -> None:
    data = tp_sample()
    fig = tp.draw_tp(data, common.THEMES["light"])
    decode, kernels, all_reduce = fig.subfigs
    assert fig.texts[0].get_text() == "Tensor parallelism, TP=2 against TP=1 on NVIDIA H200 ×2"
    # batch-size-1 decode: a panel per TP size on one time axis, each with its own roofline
    one, two = decode.axes
    assert one.get_title(loc="left") == "TP=1: decode at batch size 1, 16 GB read per rank per step"
    assert two.get_title(loc="left") == "TP=2: decode at batch size 1, 8 GB read per rank per step"
    assert [t.get_text() for t in one.get_yticklabels()] == ["graphs off (eager)", "graphs on", "HBM roofline"]
    assert [t.get_text() for t in two.get_yticklabels()] == ["graphs off (eager)", "graphs on", "graphs on, NCCL all-reduce",
                                                             "HBM roofline"]
    assert [p.get_width() for p in one.patches] == pytest.approx([6.0, 5.0, 4.0])
    assert [p.get_width() for p in two.patches] == pytest.approx([8.0, 4.0, 4.4, 2.0])
    assert [t.get_text() for t in two.texts] == ["8 ms", "4 ms   →  1.25× faster than TP=1", "4.4 ms",
                                                 "2 ms   (graphs on reach 50% of it)"]
    assert one.texts[2].get_text() == "4 ms   (graphs on reach 80% of it)"
    assert one.get_shared_x_axes().joined(one, two), "both TP sizes on one time axis"
    assert two.get_xlabel() == "ms per output token (lower is better); roofline: bytes one rank reads per step / copy bandwidth"
    # the kernels of one step: a stacked bar per engine, the kinds in order of device time
    (ax,) = kernels.axes
    assert ax.get_title(loc="left") == "llama-3.1-8b: kernels of one decode step at batch size 1, by kind"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["TP=1", "TP=2", "TP=2, NCCL all-reduce"]
    order = ["matmul", "attention", "all-reduce / all-gather (NCCL)", "all-reduce (symmetric memory)", "other"]
    expected = [TP_KERNELS[key][kind][1] for key in TP_KERNELS for kind in order if kind in TP_KERNELS[key]]
    assert [p.get_width() for p in ax.patches] == pytest.approx(expected)
    assert [t.get_text() for t in ax.texts] == ["233 kernels, 4,302 µs", "363 kernels, 2,816 µs", "299 kernels, 2,762 µs"]
    assert [t.get_text() for t in kernels.legends[0].get_texts()] == order
    # the all-reduce: µs against bytes on log scales, a line per way of calling it
    (ax,) = all_reduce.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["NCCL, eager", "NCCL in a CUDA graph", "symmetric memory, eager", "symmetric memory in a CUDA graph"]
    assert list(lines["NCCL, eager"].get_xdata()) == [8192, 4 << 20, 8 << 20]
    assert list(lines["symmetric memory in a CUDA graph"].get_ydata()) == [7.0, 33.0], "symmetric memory up to 4 MiB only"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8 KiB\nbs 1", "4 MiB\nbs 512", "8 MiB\nbs 1024"]
    assert ax.get_title(loc="left") == "All-reduce between the 2 ranks (lower is better)"


@pytest.mark.parametrize("path", tp_results(), ids=lambda p: p.stem)
def test_tp_committed_results(path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    data = json.loads(path.read_text(encoding="utf-8"))
    results = data["results"]
    text = tp_section(data, path.relative_to(REPO).as_posix())
    for key, run in results["decode"].items():
        label = f"TP={key[2:]}"
        cells = table_row(text, label)
        settings = [s for s in ("graphs_off", "graphs_on", "graphs_on_symmetric", "graphs_on_nccl") if any(s in r for r in results["decode"].values())]
        assert cells[:len(settings)] == [common._number(run[s], "ms") if s in run else "—" for s in settings]
        if "roofline_ms" in run:
            assert cells[-2:] == [common._number(run["roofline_ms"], "ms"), f"{run['fraction_of_roofline']:.1%}"]
    assert f"**{results['decode_speedup']:.3f}×**" in table_row(text, "TP=2 speed-up over TP=1")
    assert f"batch-size-1 decode **{results['decode_speedup']:.3f}×**" in text.splitlines()[2]
    for key, profile in results.get("kernels_per_decode_step", {}).items():
        column = list(results["kernels_per_decode_step"]).index(key)
        total = sum(k["us_per_step"] for k in profile["by_kind"].values())
        assert table_row(text, "all kernels")[column] == f"**{common._number(profile['kernels_per_step'])} · {common._number(total, 'µs')}**"
    head = next(line for line in text.splitlines() if line.startswith("| batch size | message |"))
    for row in results["all_reduce"]:
        assert table_row(text, common._fmt(row["batch_size"]), head)[0] == graphs._binary_bytes(row["bytes"])
    trace = results.get("decode_trace")
    if trace:
        assert table_row(text, "TP=1", TP_TRACE_HEAD)[0] == f"**{common._number(trace['tp1']['summary']['period_ms'], 'ms')}**"
    yard = results.get("yardstick")
    if yard:
        if len(yard["tp2"]) == 1:  # one repeat: its own row is the result (bold), no median row
            head = next(line for line in text.splitlines() if line.startswith("| repeat |"))
            assert table_row(text, "1", head)[2] == f"**{yard['speedup']:.3f}×**"
            assert "| median |" not in text
        else:
            assert table_row(text, "median")[2] == f"**{yard['speedup']:.3f}×**"
    assert nothing_dumped(text)

    fig = tp.draw_tp(data, common.THEMES["dark"])
    kernels = tp._tp_kernels(data)
    assert len(fig.axes) == len(results["decode"]) + (1 if kernels else 0) + 1
    FigureCanvasAgg(fig).draw()
    for sub in fig.subfigs:
        for legend in sub.legends:  # long kinds wrapped, fewer columns: no wider than the plot
            assert legend.get_window_extent().width / fig.dpi <= common.PLOT_WIDTH_IN
            colors = {(tuple(p.get_facecolor())) for p in legend.get_patches()}
            assert len(colors) == len(legend.get_patches()), "a colour (or shade) of its own for each kind"


def test_tp_cpu_file() -> None:
    """A CPU run: graphs off only, no roofline, kernels, trace or symmetric memory; one yardstick run."""
    data = tp_cpu()
    text = tp_section(data)
    lines = [line for line in text.splitlines() if line]
    assert lines[0].startswith("**tiny-qwen3** · cpu · float32 · TP=2 against TP=1 over gloo · ")
    assert lines[1] == "TP=2 against TP=1: batch-size-1 decode **0.233×** (graphs off); offline yardstick **0.386×** (one run)."
    assert "| | graphs off (eager) | bytes read per rank per step | roofline | share of the roofline |" in text
    assert table_row(text, "TP=1") == ["4.06 ms", "680 kB", "—", "—"]
    assert table_row(text, "TP=2 speed-up over TP=1") == ["**0.233×**", "", "", ""]
    assert "No roofline: the run measured no device copy bandwidth." in text
    assert "| batch size | message | gloo, eager |" in text
    assert table_row(text, "8192", "| batch size | message | gloo, eager |") == ["2 MiB", "4,956 µs"], "one way: nothing in bold"
    assert "A decode step calls 7 × all-reduce and 1 × all-gather." in text and "CUDA graph" not in text
    assert table_row(text, "1", "| repeat | TP=1 | TP=2 | TP=2 / TP=1 | KV pages (TP=1, TP=2) |")[2] == "**0.386×**"
    for absent in ("NCCL all-reduce", "Kernels of one decode step", "Decode steps", "median"):
        assert absent not in text
    assert nothing_dumped(text)

    fig = tp.draw_tp(data, common.THEMES["light"])
    decode, all_reduce = fig.subfigs
    assert fig.texts[0].get_text() == "Tensor parallelism, TP=2 against TP=1 on CPU x86_64, 2 cores"
    one, two = decode.axes
    assert [t.get_text() for t in two.get_yticklabels()] == ["graphs off (eager)"]
    assert two.texts[0].get_text() == "17.4 ms   →  0.233× as fast as TP=1"
    assert two.get_xlabel() == "ms per output token (lower is better)", "no roofline drawn, none named"
    assert [line.get_label() for line in all_reduce.axes[0].get_lines()] == ["gloo, eager"]
    res = common.BenchmarkResult("benchmarks/results/tp_cpu.json", data)
    assert set(common.render_svgs(tp.draw_tp, res)) == {"light", "dark"}


def test_tp_file_with_missing_keys_still_draws() -> None:
    """Each part alone, no config or hardware, TP=2 without its NCCL run: what is there is drawn."""
    data = tp_sample()
    results = data["results"]
    del data["config"], data["hardware"], results["decode_speedup"], results["collectives_per_decode_step"]
    del results["decode"]["tp2"]["graphs_on_nccl"], results["kernels_per_decode_step"]["tp2_nccl"]
    del results["decode_trace"]["tp2_nccl"], results["decode_trace"]["batch"]
    for run in results["decode"].values():
        del run["fraction_of_roofline"]
    text = tp_section(data)
    assert text.splitlines()[0] == "TP=2 against TP=1"
    assert table_row(text, "TP=2") == ["8 ms", "4 ms", "8 GB", "2 ms", "50.0%"], "the share computed, no NCCL column"
    assert table_row(text, "TP=2 speed-up over TP=1")[:2] == ["0.750×", "**1.250×**"], "the speed-up computed"
    assert "| kind | TP=1 | TP=2 |" in text and "NCCL all-reduce" not in text
    assert "| batch size | message | torch.distributed, eager |" in text and "A decode step calls" not in text
    assert "**Decode steps**, traced" in text and table_row(text, "TP=2", TP_TRACE_HEAD)[:3] == ["**5 ms**", "—", "1.600×"]
    fig = tp.draw_tp(data, common.THEMES["light"])
    assert fig.texts[0].get_text() == "Tensor parallelism, TP=2 against TP=1"
    assert [t.get_text() for t in fig.subfigs[0].axes[1].get_yticklabels()] == ["graphs off (eager)", "graphs on", "HBM roofline"]

    data = tp_sample()  # TP=1 alone: no speed-up anywhere
    del data["results"]["decode"]["tp2"], data["results"]["decode_speedup"]
    text = tp_section(data)
    assert "speed-up over" not in text and "batch-size-1 decode **" not in text
    assert len(tp.draw_tp(data, common.THEMES["light"]).subfigs[0].axes) == 1

    data = {"benchmark": "tp", "results": {"decode": {"tp2": {"graphs_on_nccl": 4.4, "roofline_ms": 2.0}}}}
    text = tp_section(data)  # a setting of TP=2 alone: drawn, no share without its graphs-on run
    assert table_row(text, "TP=2") == ["4.4 ms", "—", "2 ms", "—"]
    assert [t.get_text() for t in tp.draw_tp(data, common.THEMES["light"]).axes[0].texts] == ["4.4 ms", "2 ms"]

    data = {"benchmark": "tp", "results": {"all_reduce": tp_sample()["results"]["all_reduce"]}}
    fig = tp.draw_tp(data, common.THEMES["dark"])
    assert not fig.subfigs and len(fig.axes) == 1, "the all-reduce alone"
    assert "symmetric memory in a CUDA graph" in tp_section(data)

    data = {"benchmark": "tp", "results": {"yardstick": tp_sample()["results"]["yardstick"],
                                           "decode_trace": tp_sample()["results"]["decode_trace"]}}
    res = common.BenchmarkResult("benchmarks/results/tp_x.json", data)
    assert tp.draw_tp(data, common.THEMES["light"]) is None and common.render_svgs(tp.draw_tp, res) == {}
    text = tp_section(data)
    assert "median" in text and "Decode steps of 128 requests" in text and "![" not in text, "tables alone, no plot"
    for results in (None, [], {"decode": []}, {"decode": {"tp1": {"graphs_off": "slow"}}}, {"yardstick": {"tp1": 3}},
                    {"all_reduce": [{"bytes": 0, "eager_us": 1.0}, {"bytes": 8, "batch_size": 1}]},
                    {"kernels_per_decode_step": {"tp1": {"by_kind": {"x": {"kernels_per_step": 1}}}}},
                    {"decode_trace": {"batch": 128, "tp1": {"summary": {"period_ms": 0}}, "tp2": {"steps": []}}}):
        assert tp.draw_tp({"results": results}, common.THEMES["dark"]) is None
        assert tp.tp_section(common.BenchmarkResult("benchmarks/results/tp_x.json", {"results": results})) is None


def test_tp_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/tp_x.json", tp_sample())
    svgs = common.render_svgs(tp.draw_tp, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())



# --------------------------------------------------------------------------------------------
# The drawing of the serving benchmark (serving_*.json), without a site build
# --------------------------------------------------------------------------------------------


def serving_run(ttft: float, tpot: float, e2e: float, out_tok_s: float, req_s: float, concurrency: float,
                input_tokens: int = 256 * 768, cached: int = 0, failed: int = 0, rate: float | None = None) -> dict:
    """One run's metrics as `python -m benchmarks serving` writes them, with round numbers:
    each latency's p90 and p99 twice and three times its p50 (ms), its mean 1.1 times."""
    def stats(p50: float) -> dict:
        return {"mean": 1.1 * p50, "p50": p50, "p90": 2 * p50, "p99": 3 * p50}

    return {"request_rate": rate, "max_concurrency": None, "completed": 256 - failed, "failed": failed,
            "duration_s": 256 / req_s, "total_input_tokens": input_tokens, "total_output_tokens": 256 * 192,
            "cached_tokens": cached, "request_throughput": req_s, "input_throughput": input_tokens * req_s / 256,
            "output_throughput": out_tok_s, "concurrency": concurrency, "ttft_ms": stats(ttft), "tpot_ms": stats(tpot),
            "itl_ms": stats(0.9 * tpot), "e2e_ms": stats(e2e)}


def chunked_run(short_ttft: float, short_p99: float, long_ttft: float) -> dict:
    """A run of the long+short workload: all requests, and each tag's alone (``by_tag``)."""
    run = serving_run(short_ttft, 6.0, 250.0, 500.0, 16.0, 5.0, rate=16.0)
    short, long = serving_run(short_ttft, 6.0, 240.0, 480.0, 15.5, 4.5), serving_run(long_ttft, 7.0, 600.0, 15.0, 0.5, 0.5)
    short["ttft_ms"]["p99"] = short_p99
    for r in (run, short, long):
        del r["request_rate"], r["max_concurrency"]
    return {**run, "by_tag": {"long": long, "short": short}}


def serving_sample(radix: bool = True, chunked: bool = True) -> dict:
    """A made-up GPU run of the suite: the curve at 10, 20 and 40 req/s and all at once (the
    rates out of order, as a run with --request-rate 20,10,40 writes them), the radix cache off
    and on, chunked prefill off and on (8,192-token chunks) and with 2,048-token chunks (a
    variant), with the ratios the benchmark computes."""
    results: dict = {"curve": {
        "workload": {"kind": "random", "num_prompts": 256, "input_len": 1024, "output_len": 256, "range_ratio": 0.5},
        "points": [serving_run(30.0, 5.0, 1000.0, 4000.0, 20.0, 20.0, rate=20.0),
                   serving_run(20.0, 4.0, 800.0, 2000.0, 10.0, 8.0, rate=10.0),
                   serving_run(60.0, 8.0, 1600.0, 7000.0, 35.0, 56.0, rate=40.0),
                   serving_run(400.0, 20.0, 4000.0, 12000.0, 60.0, 240.0)],
    }}
    if radix:
        off = serving_run(250.0, 25.0, 7000.0, 7000.0, 27.0, 240.0, input_tokens=557056)
        on = serving_run(50.0, 10.0, 2800.0, 20000.0, 78.0, 230.0, input_tokens=557056, cached=491520)
        for r in (on, off):
            del r["request_rate"], r["max_concurrency"]
        results["radix"] = {
            "workload": {"kind": "shared-prefix", "groups": 16, "per_group": 16, "system_len": 2048, "question_len": 128,
                         "output_len": 256},
            "request_rate": None, "on": on, "off": off,
            "ratios": {"output_throughput": 20000 / 7000, "ttft_p50": 5.0, "ttft_p99": 5.0, "e2e_p50": 2.5}}
    if chunked:
        results["chunked"] = {
            "workload": {"kind": "long+short", "num_short": 256, "short_input_len": 128, "output_len": 32, "num_long": 8,
                         "long_len": 32768},
            "request_rate": 16.0, "chunked_prefill_size": 8192,
            "on": chunked_run(30.0, 100.0, 400.0), "off": chunked_run(40.0, 400.0, 320.0),
            "ratios": {"output_throughput": 1.0, "short_ttft_p50": 40 / 30, "short_ttft_p99": 4.0, "short_e2e_p50": 1.0},
            "variants": [{"chunked_prefill_size": 2048, "metrics": chunked_run(25.0, 50.0, 600.0),
                          "ratios": {"output_throughput": 1.0, "short_ttft_p50": 1.6, "short_ttft_p99": 8.0, "short_e2e_p50": 1.0}}]}
    return {
        "benchmark": "serving",
        "date": "2026-11-22T10:00:00+00:00",
        "commit": "abc1234",
        "hardware": {"cpu": "x86_64", "cpu_count": 16, "gpu": "NVIDIA H200", "gpu_count": 1},
        "config": {"shape": "qwen3-0.6b", "device": "cuda", "dtype": "bfloat16", "dummy_weights": True, "base_url": None,
                   "server_args": ["--dummy-weights"], "seed": 0, "warmup_requests": 2},
        "results": results,
    }


def serving_section(data: dict, rel: str = "benchmarks/results/serving_x.json") -> str:
    lines = serving.serving_section(common.BenchmarkResult(rel, data))
    assert lines is not None, "a serving result with a usable curve or comparison must get its own section"
    return "\n".join(lines)


def test_serving_metric_names() -> None:
    """The names of the benchmark's ratios double as the view's names of metrics."""
    assert serving._serving_key("output_throughput") == (None, "output_throughput", None)
    assert serving._serving_key("ttft_p50") == (None, "ttft_ms", "p50")
    assert serving._serving_key("short_ttft_p99") == ("short", "ttft_ms", "p99")
    assert serving._serving_key("long_e2e_mean") == ("long", "e2e_ms", "mean")
    assert serving._serving_key("speedup") is None and serving._serving_key("ttft") is None
    run = chunked_run(30.0, 100.0, 400.0)
    assert serving._serving_value(run, "short_ttft_p99") == 100.0 and serving._serving_value(run, "long_ttft_p50") == 400.0
    assert serving._serving_value(run, "ttft_p50") == 30.0 and serving._serving_value(run, "nobody_ttft_p50") is None
    run["tpot_ms"]["p50"] = float("nan")  # the benchmark's value for an empty sample
    assert serving._serving_value(run, "tpot_p50") is None
    assert serving._serving_label("short_ttft_p99") == "short-request TTFT p99"
    assert serving._serving_label("request_throughput") == "completed req/s"


def test_serving_section_numbers() -> None:
    text = serving_section(serving_sample())
    lines = [line for line in text.splitlines() if line]
    assert lines[0] == ("**qwen3-0.6b** · cuda · bfloat16 · a minisgl server started by the run with `--dummy-weights` · "
                        "random weights · 2 uncounted warm-up requests before each run")
    assert lines[1] == (
        "Highest output throughput **12,000 tok/s** (all at once). "
        "Radix cache on against off: output tok/s **2.86×**, TTFT p50 **5× lower**, TTFT p99 5× lower, E2E p50 2.5× lower. "
        "Chunked prefill, chunks of 8,192 against whole prompts: output tok/s 1.00×, short-request TTFT p50 1.33× lower, "
        "short-request TTFT p99 **4× lower**, short-request E2E p50 1× lower. "
        "Chunked prefill, chunks of 2,048 against whole prompts: output tok/s 1.00×, short-request TTFT p50 1.6× lower, "
        "short-request TTFT p99 **8× lower**, short-request E2E p50 1× lower.")
    # the curve: its workload in words, a row per point by rate, all at once last
    assert ("**Against the request rate**: 256 requests of random token ids, input 512–1,024 and output 128–256 tokens "
            "(uniform); Poisson arrivals at 10, 20 and 40 req/s, and all at once.") in text
    head = serving.SERVING_CURVE_HEAD
    rows = [line for line in text.splitlines()[text.splitlines().index(head) + 2:]]
    rows = rows[:rows.index("")]
    assert [row.split(" | ")[0] for row in rows] == ["| 10 req/s", "| 20 req/s", "| 40 req/s", "| all at once"]
    assert table_row(text, "10 req/s", head) == ["10", "2,000", "8", "20", "60", "4", "12", "3.6", "10.8", "800", "2,400", "0"]
    assert table_row(text, "all at once", head) == ["60", "12,000", "240", "400", "1,200", "20", "60", "18", "54", "4,000",
                                                    "12,000", "0"]
    assert "TPOT: time per output token after the first, (E2E − TTFT) / (output tokens − 1)" in text
    assert '??? note "Every metric of every point"' in text and "| all at once | 256 | 0 | 4.267 |" in text
    # the radix cache: a row per metric, the headline ratios in bold, the cached prompt tokens
    assert ("**Radix cache off and on**: 256 requests = 16 groups × 16, a 2,048-token system prompt shared by a group + "
            "a 128-token question, 256-token answers; all at once.") in text
    radix_head = "| | cache off | cache on | on against off |"
    assert table_row(text, "output tok/s", radix_head) == ["7,000", "20,000", "**2.86×**"]
    assert table_row(text, "completed req/s", radix_head) == ["27", "78", "2.89×"], "a ratio the file lacks, computed"
    assert table_row(text, "TTFT p50 (ms)", radix_head) == ["250", "50", "**5× lower**"]
    assert table_row(text, "E2E p99 (ms)", radix_head) == ["21,000", "8,400", "2.5× lower"]
    assert table_row(text, "cached prompt tokens", radix_head) == ["0 (0%)", "491,520 (88%)", ""]
    assert table_row(text, "failed requests", radix_head) == ["0", "0", ""]
    # chunked prefill: the short requests' TTFT, the long ones' cost
    assert ("**Chunked prefill off and on**: 256 short requests (128-token prompts) with 8 long ones (32,768-token "
            "prompts) among them, 32-token answers; Poisson arrivals at 16 req/s.") in text
    chunked_head = ("| | whole prompts | chunks of 8,192 | chunks of 2,048 | chunks of 8,192 against whole prompts "
                    "| chunks of 2,048 against whole prompts |")
    assert table_row(text, "short-request TTFT p99 (ms)", chunked_head) == ["400", "100", "50", "**4× lower**", "**8× lower**"]
    assert table_row(text, "long-request TTFT p50 (ms)", chunked_head) == ["320", "400", "600", "1.25× higher",
                                                                           "1.88× higher"], "computed: the file has no ratio"
    assert table_row(text, "output tok/s", chunked_head) == ["500", "500", "500", "1.00×", "1.00×"]
    assert table_row(text, "failed requests", chunked_head) == ["0", "0", "0", "", ""]
    assert "cached prompt tokens" not in text.split(chunked_head)[1], "no row of zeros"
    for dumped in ("ratios", "by_tag", "chunked_prefill_size", "request_rate", "variants"):
        assert dumped not in text


def test_serving_plot() -> None:
    data = serving_sample()
    fig = serving.draw_serving(data, common.THEMES["light"])
    curve, radix, chunked = fig.subfigs
    assert fig.texts[0].get_text() == "Serving through HTTP on NVIDIA H200"
    assert curve._suptitle.get_text() == "Against the request rate (Poisson arrivals): 256 requests, 512–1,024 tokens in, 128–256 out"
    assert radix._suptitle.get_text() == "Radix cache off and on: 16 groups × 16 requests sharing 2,048-token prefixes, all at once"
    assert chunked._suptitle.get_text() == "Chunked prefill off and on: 256 short requests and 8 long (32,768 tokens), Poisson at 16 req/s"
    # the curve: latencies above, throughputs and requests in flight below, on one rate axis
    ttft, tpot, e2e, out_tok, req_s, in_flight = curve.axes
    assert [ax.get_title(loc="left") for ax in curve.axes] == [
        "TTFT (ms)", "TPOT (ms)", "E2E (ms)", "output tokens per second", "requests completed per second",
        "requests in flight (mean)"]
    assert ttft.get_yscale() == "log" and tpot.get_yscale() == "linear", "TTFT spans 20 to 1,200 ms; TPOT 4 to 60"
    assert ttft.get_xscale() == "linear", "rates 10 to 40: a linear axis"
    burst_x = 40 + 1.5 * 15  # one and a half steps right of the highest rate
    lines = [(list(line.get_xdata()), list(line.get_ydata()), line.get_linestyle()) for line in ttft.get_lines()]
    assert lines[:2] == [([10, 20, 40], [20, 30, 60], "-"), ([burst_x], [400], "None")], "p50: rates joined, all at once alone"
    assert lines[4:6] == [([10, 20, 40], [60, 90, 180], "-"), ([burst_x], [1200], "None")], "p99"
    assert lines[6][0] == [40 + 0.75 * 15] * 2, "the dotted separator between the rates and all at once"
    assert [t.get_text() for t in in_flight.get_xticklabels()] == ["10", "20", "40", "all\nat once"]
    assert list(out_tok.get_lines()[0].get_ydata()) == [2000, 4000, 7000]
    offered = req_s.get_lines()[2]
    assert offered.get_linestyle() == "--" and list(offered.get_ydata()) == [10, 20, 40], "completed = offered"
    assert list(in_flight.get_lines()[1].get_ydata()) == [240]
    assert [t.get_text() for t in curve.legends[0].get_texts()] == ["p50", "p90", "p99", "completed = offered"]
    assert out_tok.get_xlabel() == "offered request rate (req/s)"
    # the comparisons: a panel per metric, a bar per run, each on bar labelled with its ratio to off
    assert [ax.get_title(loc="left") for ax in radix.axes] == ["TTFT p50 (ms)", "TTFT p99 (ms)", "E2E p50 (ms)", "output tok/s"]
    assert [p.get_width() for p in radix.axes[0].patches] == [250, 50]
    assert [t.get_text() for t in radix.axes[0].texts] == ["250", "50   →  5× lower"]
    assert [t.get_text() for t in radix.axes[3].texts] == ["7,000", "20,000   →  2.86×"]
    assert [t.get_text() for t in radix.axes[0].get_yticklabels()] == ["cache off", "cache on"]
    assert [ax.get_title(loc="left") for ax in chunked.axes] == [
        "short-request TTFT p50 (ms)", "short-request TTFT p99 (ms)", "long-request TTFT p50 (ms)", "output tok/s"]
    assert [p.get_width() for p in chunked.axes[1].patches] == [400, 100, 50]
    assert [t.get_text() for t in chunked.axes[1].texts] == ["400", "100   →  4× lower", "50   →  8× lower"]
    assert [t.get_text() for t in chunked.axes[2].texts] == ["320", "400   →  1.25× higher", "600   →  1.88× higher"]
    assert [t.get_text() for t in chunked.axes[0].get_yticklabels()] == ["whole prompts", "chunks of 8,192", "chunks of 2,048"]


def test_serving_run_against_a_given_server() -> None:
    """--base-url: the curve alone, the client's hardware, a cap on requests in flight, a point
    whose TPOT sample was empty (NaN) and one with failed requests."""
    data = serving_sample(radix=False, chunked=False)
    data["config"] = {"base_url": "http://127.0.0.1:1919", "model": None, "seed": 0, "warmup_requests": 2, "vocab_size": 1000}
    points = data["results"]["curve"]["points"]
    for p in points:
        p["max_concurrency"] = 32
    points[3]["tpot_ms"] = {q: float("nan") for q in ("mean", "p50", "p90", "p99")}
    points[3].update(failed=3, errors=["HTTP 503: too many\nrequests"])
    text = serving_section(data)
    assert text.splitlines()[0] == ("the server at `http://127.0.0.1:1919` (the hardware above is the client's) · "
                                    "2 uncounted warm-up requests before each run")
    assert "Poisson arrivals at 10, 20 and 40 req/s, and all at once; at most 32 requests in flight." in text
    head = serving.SERVING_CURVE_HEAD
    assert table_row(text, "all at once, ≤ 32 in flight", head)[5:7] == ["—", "—"], "no TPOT"
    assert table_row(text, "all at once, ≤ 32 in flight", head)[-1] == "**3**"
    assert table_row(text, "10 req/s, ≤ 32 in flight", head)[0] == "10"
    assert "Errors of the failed requests: `HTTP 503: too many requests`." in text
    assert "nan" not in text and "Radix" not in text and "Chunked" not in text

    fig = serving.draw_serving(data, common.THEMES["dark"])
    (curve,) = fig.subfigs
    assert fig.texts[0].get_text() == "Serving through HTTP at http://127.0.0.1:1919"
    tpot, out_tok = curve.axes[1], curve.axes[3]
    assert [t.get_text() for t in out_tok.get_xticklabels()] == ["10", "20", "40", "all\nat once\n≤ 32 in flight"]
    assert [len(line.get_xdata()) for line in tpot.get_lines()] == [3, 3, 3, 2], "no TPOT marker for all at once"


def test_serving_all_at_once_only() -> None:
    data = serving_sample(radix=False, chunked=False)
    data["results"]["curve"]["points"] = data["results"]["curve"]["points"][3:]
    text = serving_section(data)
    assert "; all at once." in text and "Poisson" not in text
    fig = serving.draw_serving(data, common.THEMES["light"])
    (curve,) = fig.subfigs
    assert curve._suptitle.get_text().startswith("All requests at once: 256 requests")
    assert [t.get_text() for t in curve.legends[0].get_texts()] == ["p50", "p90", "p99"], "no rate offered"
    assert [t.get_text() for t in curve.axes[3].get_xticklabels()] == ["all\nat once"]
    assert all(len(ax.get_lines()) <= 3 for ax in curve.axes), "no separator"


def test_serving_rates_far_apart() -> None:
    """Rates spread over 8× or more: a log rate axis, all at once an octave right of the highest
    rate, and a rate's label left out where it would touch the last one shown."""
    points = [{"request_rate": r} for r in (1.0, 2.0, 4.0, 8.0, 41.0, 62.0, 74.0)] + [{"request_rate": None}]
    xs, log, separator = serving._serving_x(points)
    assert log and xs[-1] == 148.0 and separator == pytest.approx(74 * 2 ** 0.5)
    assert serving._serving_tick_labels(points, xs, log) == ["1", "2", "4", "8", "41", "", "74", "all\nat once"]
    data = serving_sample(radix=False, chunked=False)
    data["results"]["curve"]["points"][1]["request_rate"] = 1.0
    fig = serving.draw_serving(data, common.THEMES["light"])
    assert fig.subfigs[0].axes[0].get_xscale() == "log"
    assert fig.subfigs[0].axes[3].get_xlabel() == "offered request rate (req/s, log scale)"


def test_serving_ratios_are_computed_when_the_file_has_none() -> None:
    data = serving_sample()
    del data["results"]["radix"]["ratios"], data["results"]["chunked"]["ratios"]
    del data["results"]["chunked"]["variants"][0]["ratios"]
    text = serving_section(data)
    assert "Radix cache on against off: output tok/s **2.86×**, TTFT p50 **5× lower**." in text
    assert "Chunked prefill, chunks of 8,192 against whole prompts: short-request TTFT p99 **4× lower**." in text
    assert "Chunked prefill, chunks of 2,048 against whole prompts: short-request TTFT p99 **8× lower**." in text
    assert table_row(text, "short-request TTFT p50 (ms)", "| | whole prompts | chunks of 8,192 | chunks of 2,048 "
                     "| chunks of 8,192 against whole prompts | chunks of 2,048 against whole prompts |") == [
        "40", "30", "25", "1.33× lower", "1.6× lower"]
    fig = serving.draw_serving(data, common.THEMES["light"])
    assert fig.subfigs[2].axes[1].texts[2].get_text() == "50   →  8× lower"


def test_serving_file_with_missing_keys_still_draws() -> None:
    """A broken point is left out, a comparison without both runs goes to the generic tables,
    a comparison alone is drawn; nothing usable: no plot, no section (the generic tables)."""
    data = serving_sample()
    results = data["results"]
    results["curve"]["points"] += [{"request_rate": 8.0}, {**results["curve"]["points"][0], "request_rate": "fast"}]
    del results["radix"]["off"], data["config"], data["hardware"], results["chunked"]["chunked_prefill_size"]
    del results["chunked"]["on"]["by_tag"]["long"]
    results["chunked"]["variants"] += [{"chunked_prefill_size": 512, "metrics": {"failed": 256}}, "not a run"]
    text = serving_section(data)
    assert text.splitlines()[0].startswith("Highest output throughput"), "no setup line without a config"
    assert "| 8 req/s" not in text and "fast" not in text
    assert "Radix cache on against off" not in text and "| radix.ratios.ttft_p50 | 5 |" in text, "radix: generic tables"
    chunked_head = ("| | whole prompts | chunked | chunks of 2,048 | chunked against whole prompts "
                    "| chunks of 2,048 against whole prompts |")
    assert table_row(text, "long-request TTFT p50 (ms)", chunked_head) == ["320", "—", "600", "—", "1.88× higher"]
    assert "chunks of 512" not in text, "a variant without metrics is left out"
    fig = serving.draw_serving(data, common.THEMES["light"])
    curve, chunked = fig.subfigs
    assert fig.texts[0].get_text() == "Serving through HTTP"
    assert len(curve.axes[0].get_lines()[0].get_xdata()) == 3
    assert [ax.get_title(loc="left") for ax in chunked.axes if ax.get_visible()] == [
        "short-request TTFT p50 (ms)", "short-request TTFT p99 (ms)", "output tok/s"], "no long-request panel without its run"
    assert [t.get_text() for t in chunked.axes[0].get_yticklabels()] == ["whole prompts", "chunked", "chunks of 2,048"]

    data = serving_sample()
    del data["results"]["curve"]  # the comparisons alone
    fig = serving.draw_serving(data, common.THEMES["dark"])
    assert [sub._suptitle.get_text().split(":")[0] for sub in fig.subfigs] == ["Radix cache off and on", "Chunked prefill off and on"]
    assert "Highest output throughput" not in serving_section(data)

    for results in (None, [], {"curve": []}, {"curve": {"points": {}}}, {"curve": {"points": [{"request_rate": 8.0}]}},
                    {"curve": {"points": [{**serving_run(1, 1, 1, 1, 1, 1), "request_rate": 0}]}},
                    {"radix": {"on": serving_run(1, 1, 1, 1, 1, 1)}}, {"chunked": {"on": {}, "off": {}}}):
        data = {"benchmark": "serving", "results": results}
        res = common.BenchmarkResult("benchmarks/results/serving_x.json", data)
        assert serving.draw_serving(data, common.THEMES["light"]) is None and common.render_svgs(serving.draw_serving, res) == {}
        assert serving.serving_section(res) is None


def test_serving_svgs_render_for_both_themes() -> None:
    res = common.BenchmarkResult("benchmarks/results/serving_x.json", serving_sample())
    svgs = common.render_svgs(serving.draw_serving, res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


# Code blocks of lesson pages and notebook cells (input and text output).


# --------------------------------------------------------------------------------------------
# steps: the yardstick step by step (results.groups, results.profiled_windows, results.steps)
# --------------------------------------------------------------------------------------------


def steps_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "steps")


def test_there_are_steps_results_to_draw() -> None:
    assert steps_results(), "benchmarks/results/ should hold a bench steps run"


@pytest.mark.parametrize("path", steps_results(), ids=lambda p: p.name)
def test_steps_section_groups_and_windows(path: Path) -> None:
    from benchmarks.plots import steps

    data = json.loads(path.read_text(encoding="utf-8"))
    lines = steps.steps_section(common.BenchmarkResult("benchmarks/results/steps_x.json", data))
    text = "\n".join(lines)
    for group in data["results"]["groups"]:
        assert f"| {group} |" in text
    assert "bound_out_tok_s" in text and "Profiled: 10 decode step(s)" in text
    assert len(lines) < 120, "the per-step records stay in the file"
    fig = steps.draw_steps(data, common.THEMES["light"])
    assert len(fig.axes[0].patches) == 2 * (len(data["results"]["groups"]) - 1)  # busy and bound per kind


def test_steps_file_without_groups_gets_generic_tables() -> None:
    from benchmarks.plots import steps

    data = {"benchmark": "steps", "results": {"output_tokens": 10}}
    assert steps.steps_section(common.BenchmarkResult("benchmarks/results/steps_x.json", data)) is None
    assert steps.draw_steps(data, common.THEMES["light"]) is None
    svgs = common.render_svgs(steps.draw_steps, common.BenchmarkResult(
        "benchmarks/results/x.json", json.loads(steps_results()[0].read_text(encoding="utf-8"))))
    assert set(svgs) == {"light", "dark"}


# --------------------------------------------------------------------------------------------
# moe: the MoE layer per batch size (results.layer), bs=1 decode (results.decode_bs1), and one
# GPU against TP and EP (results.parallel)
# --------------------------------------------------------------------------------------------

MOE_HEAD = ("| batch size | experts touched | bytes | fused | reference | fused speed-up | bytes bound "
            "| fused, share of the bound |")
MOE_FORMS_HEAD = ("| batch size | experts touched | bytes | grouped | matrix-vector | reference | fused speed-up "
                  "| bytes bound | fused, share of the bound |")
PARALLEL_HEAD = ("|  | settings | bs=1 decode (runs) | bs=1, over one GPU | all-reduces, share of a bs=1 step "
                 "| yardstick | yardstick, over one GPU |")


def moe_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json") if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "moe")


def moe_text(data: dict, plots: dict[str, str] | None = None) -> str:
    from benchmarks.plots import moe

    lines = moe.moe_section(common.BenchmarkResult("benchmarks/results/moe_x.json", data, plots or {}))
    assert lines is not None, "a moe result with layer rows, decode or a parallel comparison must get its own section"
    return "\n".join(lines)


def made_up_moe(fraction_bs1: float = 0.8, times_roofline: float | None = 1.3) -> dict:
    """A moe result with round numbers: three batch sizes, the file's own ratios left out (they
    are computed), and bs=1 decode ``times_roofline`` its roofline (None: no roofline)."""
    rows = []
    for bs, touched, fused, reference in ((1, 8, 40.0, 2000.0), (8, 50, 200.0, 30000.0), (64, 128, 500.0, 60000.0)):
        bound = fused * (fraction_bs1 if bs == 1 else 0.9)
        rows.append({"batch_size": bs, "experts_touched": touched, "bytes": int(bound * 3e6),
                     "fused_us": fused, "reference_us": reference, "bytes_bound_us": bound})
    decode = {"ms_per_token": 3.0, "runs_ms": [3.1, 3.0, 2.9], "bytes_per_step": 6_000_000_000,
              "weights_bytes": 61_000_000_000}
    if times_roofline is not None:
        decode["roofline_ms"] = 3.0 / times_roofline
    return {"benchmark": "moe", "hardware": {"gpu": "Made-up GPU"}, "config": {"shape": "qwen3-30b-a3b", "copies": 8},
            "results": {"copy_bandwidth_bytes_s": 3e12, "layer": rows, "decode_bs1": decode}}


def made_up_parallel(yardstick: bool = True) -> dict:
    """A ``--skip-layer --parallel 2`` result with round numbers: one GPU at 4 ms, TP=2 at 5 ms
    (its ratios and share left out: computed), EP=2 at 2 ms (the file's own ratios and share),
    9 all-reduces of 10 µs per step, 4 layers (2 × 4 + 1 = 9)."""
    def side(settings: dict, ms: float, tok_s: float, **extra: float) -> dict:
        entry = {"settings": settings, "decode_bs1_ms": ms, "decode_runs_ms": [ms + 0.1, ms, ms - 0.1], **extra}
        if yardstick:
            entry["yardstick"] = {"requests": 8, "output_tokens": 800, "output_tok_s": tok_s}
        return entry

    sides = {"one_gpu": side({}, 4.0, 1000.0), "tp2": side({"tp_size": 2}, 5.0, 1500.0),
             "ep2": side({"tp_size": 2, "ep_size": 2}, 2.0, 3000.0, speedup_bs1_vs_one_gpu=2.0, all_reduce_share_bs1=0.05,
                         **({"yardstick_vs_one_gpu": 3.0} if yardstick else {}))}
    return {"benchmark": "moe", "commit": "abc1234", "hardware": {"gpu": "Made-up GPU", "gpu_count": 2},
            "config": {"shape": "qwen3-30b-a3b", "model_config": {"num_hidden_layers": 4}, "copies": 8, "parallel": 2,
                       "yardstick_requests": 8 if yardstick else 0, "yardstick_len": "10,20"},
            "results": {"copy_bandwidth_bytes_s": 3e12,
                        "parallel": {"sides": sides, "all_reduces_per_step": 9, "all_reduce_us_in_graph": 10.0,
                                     "all_reduce": [{"batch_size": 1, "bytes": 4096, "eager_us": 40.0, "graph_us": 20.0,
                                                     "symmetric_graph_us": 10.0}]}}}


def test_there_are_moe_results_to_draw() -> None:
    assert moe_results(), "benchmarks/results/ should hold a moe run"


def side_label(key: str, side: dict) -> str:
    settings = side["settings"]
    if settings.get("ep_size", 1) > 1:
        return f"EP={settings['ep_size']}"
    return f"TP={settings['tp_size']}" if settings.get("tp_size", 1) > 1 else "one GPU"


@pytest.mark.parametrize("path", moe_results(), ids=lambda p: p.stem)
def test_moe_section_rows_and_targets_are_the_files(path: Path) -> None:
    """Each file by what it holds. Layer rows: a table row per batch size with the file's
    numbers, the targets judged from the file, the bs=1 decode line against its roofline.
    A parallel comparison: a table row per side (one GPU, TP, EP) with its bs=1 decode and runs,
    its ratios to one GPU, the all-reduces' share of its step and its yardstick; the all-reduce
    count and time; the GPUs and the commit. The chart: the layer's when there are layer rows,
    else the parallel comparison's."""
    data = json.loads(path.read_text(encoding="utf-8"))
    results = data["results"]
    assert "layer" in results or "parallel" in results, "a moe file holds layer rows or a parallel comparison"
    text = moe_text(data, {"light": "assets/benchmarks/moe_x-light.svg"})
    assert text.count("](assets/benchmarks/moe_x-light.svg#only-light)") == 1, "the chart, once"
    assert "copy_bandwidth_bytes_s" not in text, "the bandwidth is in words, not a leftover table"
    if "layer" in results:
        check_layer_rows(text, results)
    else:
        assert MOE_HEAD not in text and "Targets of" not in text, "no layer rows: no layer table, no layer targets"
    if "parallel" in results:
        check_parallel_sides(text, data)
    else:
        assert PARALLEL_HEAD not in text

    check_newer_parts(text, data)

    fig = plots.figure(data)
    if "layer" in results:
        assert fig._suptitle.get_text().startswith("Mixture-of-experts layer")
        check_newer_drawing(fig, data)
    else:
        sides = results["parallel"]["sides"]
        ms_ax = fig.axes[0]
        heights = [p.get_height() for p in ms_ax.patches]
        assert heights[:len(sides)] == pytest.approx([s["decode_bs1_ms"] for s in sides.values()])
        shares = [s["all_reduce_share_bs1"] * s["decode_bs1_ms"] for s in sides.values() if "all_reduce_share_bs1" in s]
        assert heights[len(sides):] == pytest.approx(shares), "each TP/EP bar's all-reduce part"
        labels = [t.get_text() for t in ms_ax.get_xticklabels()]
        assert labels == [side_label(k, s) for k, s in sides.items()]
    svgs = common.render_svgs(plots.KINDS["moe"][0], common.BenchmarkResult(path.relative_to(REPO).as_posix(), data))
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())


def form_cells(row: dict) -> list[str]:
    """The grouped and matrix-vector cells of a layer row: µs or —, the form the layer runs in bold."""
    path_key = {"grouped": "grouped_us", "gemv": "gemv_us"}[row["path"]]
    return [("**{}**" if key == path_key else "{}").format(common._number(row[key], "µs")) if key in row else "—"
            for key in ("grouped_us", "gemv_us")]


def check_layer_rows(text: str, results: dict) -> None:
    forms = any("gemv_us" in row for row in results["layer"])
    head = MOE_FORMS_HEAD if forms else MOE_HEAD
    assert head in text
    for row in results["layer"]:
        cells = table_row(text, str(row["batch_size"]), head)
        share = f"{row['fraction_of_bytes_bound']:.0%}"
        fused = form_cells(row) if forms else [common._number(row["fused_us"], "µs")]
        assert cells == [
            str(row["experts_touched"]), common._number(row["bytes"] / 1e6, "MB"), *fused,
            common._number(row["reference_us"], "µs"), common._number(row["fused_speedup_vs_reference"]) + "×",
            common._number(row["bytes_bound_us"], "µs"), f"**{share}**" if row["batch_size"] == 1 else share,
        ]
        if forms:
            assert row["fused_us"] == row[f"{row['path']}_us"], "the fused µs are those of the form the layer runs"
    lines = text.splitlines()
    table = lines[lines.index(head):]
    table = table[:table.index("")] if "" in table else table
    assert len(table) == len(results["layer"]) + 2, "a row per batch size under the head and its rule"

    bs1 = next(r for r in results["layer"] if r["batch_size"] == 1)
    layer_reached = "reached" if bs1["fraction_of_bytes_bound"] >= 0.70 else "not reached"
    assert f"bytes bound or more: **{bs1['fraction_of_bytes_bound']:.0%}, {layer_reached}**" in text
    decode = results.get("decode_bs1")
    if decode is None:
        assert "not judged (no bs=1 decode in this run)" in text
        return
    times = common._number(decode["times_roofline"])
    decode_reached = "reached" if decode["times_roofline"] <= 1.4 else "not reached"
    assert f"bs=1 decode within 1.4× its roofline: **{times}×, {decode_reached}**" in text
    assert (f"**{common._number(decode['ms_per_token'], 'ms')} per token** (median of {len(decode['runs_ms'])} runs"
            in text)
    assert f"{times}× its roofline of {common._number(decode['roofline_ms'], 'ms')}" in text


def check_parallel_sides(text: str, data: dict) -> None:
    parallel = data["results"]["parallel"]
    assert PARALLEL_HEAD in text
    hw = data["hardware"]
    assert f"on {hw['gpu_count']} × {hw['gpu']} at commit `{data['commit']}`" in text, "the GPUs and the commit"
    for key, side in parallel["sides"].items():
        cells = table_row(text, side_label(key, side), PARALLEL_HEAD)
        runs = ", ".join(common._number(r) for r in side["decode_runs_ms"])
        assert cells[1] == f"{common._number(side['decode_bs1_ms'], 'ms')} ({runs})"
        assert cells[4] == common._number(side["yardstick"]["output_tok_s"], "tok/s")
        if key == "one_gpu":
            assert cells[0] == "—" and cells[2] == cells[3] == cells[5] == "—"
            continue
        assert cells[0] == ", ".join(f"`{k}={v}`" for k, v in side["settings"].items())
        assert cells[2] == f"{common._number(side['speedup_bs1_vs_one_gpu'])}×"
        share = side["all_reduce_share_bs1"]
        assert cells[3] == f"{share:.0%} ({common._number(share * side['decode_bs1_ms'], 'ms')})"
        assert cells[5] == f"**{common._number(side['yardstick_vs_one_gpu'])}×**"
    per_step, us = parallel["all_reduces_per_step"], parallel["all_reduce_us_in_graph"]
    assert f"a bs=1 step under TP and EP alike: {per_step}" in text
    assert f", {common._number(us, 'µs')} each" in text and f"{common._number(per_step * us / 1e3, 'ms')} in all" in text
    for row in parallel["all_reduce"]:
        fastest = min(v for k, v in row.items() if k.endswith("_us"))
        assert f"**{common._number(fastest, 'µs')}**" in table_row(text, str(row["batch_size"]), all_reduce_head(text))
    requests = data["config"]["yardstick_requests"]
    assert f"the offline yardstick ({requests} requests" in text


def all_reduce_head(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| batch size | message |"))


def test_moe_parallel_drawn_from_a_made_up_result() -> None:
    """Bars per side of bs=1 ms (whiskers from the runs, the all-reduces' part hatched) and of
    the yardstick's tok/s, each labelled with its ratio to one GPU: the file's where it has one,
    else computed; the table, the all-reduce line and the measured all-reduce."""
    from benchmarks.plots import moe

    data = made_up_parallel()
    fig = plots.figure(data, "dark")
    assert fig._suptitle.get_text() == "One GPU against TP=2 against EP=2 (qwen3-30b-a3b) on Made-up GPU ×2"
    ms_ax, tok_ax = fig.axes
    assert [p.get_height() for p in ms_ax.patches] == pytest.approx([4.0, 5.0, 2.0, 0.09, 0.1])
    assert [p.get_height() for p in tok_ax.patches] == pytest.approx([1000.0, 1500.0, 3000.0])
    ms_texts = [t.get_text() for t in ms_ax.texts]
    assert ms_texts == ["4 ms", "5 ms\n0.8× as fast", "2 ms\n2× faster"]
    assert [t.get_text() for t in tok_ax.texts] == ["1,000 tok/s", "1,500 tok/s\n1.5× faster", "3,000 tok/s\n3× faster"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["the all-reduces of a step (9 × 10 µs, in a CUDA graph)"]

    text = moe_text(data, {"light": "assets/p-light.svg"})
    assert text.startswith("**qwen3-30b-a3b** · copy bandwidth 3 TB/s\n")
    assert "weights cycled" not in text, "the layer sweep's setting, not this run's"
    assert ("**One GPU against TP=2 against EP=2** on the whole model, on 2 × Made-up GPU at commit `abc1234` "
            "(`python -m benchmarks moe --skip-layer --parallel 2`)") in text
    assert "the offline yardstick (8 requests, input and output lengths 10–20 tokens)" in text
    assert table_row(text, "one GPU", PARALLEL_HEAD) == ["—", "4 ms (4.1, 4, 3.9)", "—", "—", "1,000 tok/s", "—"]
    assert table_row(text, "TP=2", PARALLEL_HEAD) == ["`tp_size=2`", "5 ms (5.1, 5, 4.9)", "0.8×", "2% (0.09 ms)",
                                                      "1,500 tok/s", "**1.5×**"]
    assert table_row(text, "EP=2", PARALLEL_HEAD) == ["`tp_size=2`, `ep_size=2`", "2 ms (2.1, 2, 1.9)", "2×",
                                                      "5% (0.1 ms)", "3,000 tok/s", "**3×**"]
    assert ("**All-reduces** of a bs=1 step under TP and EP alike: 9 (two per layer of 4, and one more), 10 µs each "
            "(the fastest in a CUDA graph, measured in the same run: below), 0.09 ms in all: 2% of TP=2's 5 ms step, "
            "5% of EP=2's 2 ms step.") in text
    assert table_row(text, "1", all_reduce_head(text)) == ["4 KiB", "40 µs", "20 µs", "**10 µs**"]
    assert "](assets/p-light.svg#only-light)" in text and "Targets of" not in text and "Decode at batch size 1**" not in text
    assert moe.moe_section(common.BenchmarkResult("benchmarks/results/moe_x.json", data, {"light": "assets/p-light.svg"})) \
        == text.splitlines()


def test_moe_parallel_parts_missing() -> None:
    """Without the yardstick: one panel, its cells empty; without the all-reduce counts: the
    shares the file has, no hatching; with layer rows too: the layer chart, both tables."""
    from benchmarks.plots import moe

    data = made_up_parallel(yardstick=False)
    fig = plots.figure(data)
    assert len(fig.axes) == 1
    text = moe_text(data)
    assert table_row(text, "TP=2", PARALLEL_HEAD)[4:] == ["—", "—"] and "offline yardstick" not in text

    data = made_up_parallel()
    parallel = data["results"]["parallel"]
    del parallel["all_reduces_per_step"], parallel["all_reduce"]
    text = moe_text(data)
    assert table_row(text, "TP=2", PARALLEL_HEAD)[3] == "—", "no count, no computed share"
    assert "**All-reduces** of a bs=1 step: 5% of EP=2's." in text and "| batch size | message |" not in text
    assert len(plots.figure(data).axes[0].patches) == 4, "three sides and EP=2's all-reduce part"
    assert plots.figure(data).legends[0].get_texts()[0].get_text() == "the all-reduces of a step"

    both = made_up_moe()
    both["results"]["parallel"] = made_up_parallel()["results"]["parallel"]
    text = moe_text(both, {"light": "assets/b-light.svg"})
    assert MOE_HEAD in text and PARALLEL_HEAD in text and text.count("](assets/b-light.svg") == 1
    assert "weights cycled" in text and "(`python -m benchmarks moe --parallel N`)" in text
    assert plots.figure(both)._suptitle.get_text().startswith("Mixture-of-experts layer")
    assert "parallel" not in [line.strip("*") for line in text.splitlines()], "shown, not a leftover table"
    assert moe.draw_moe(both, common.THEMES["light"]) is not None


def test_moe_drawn_from_a_made_up_result() -> None:
    """Left: fused, reference and bytes bound per batch size on log axes; right: the fused path's
    share of its bound (computed where the file has none) and the 70% target."""
    from benchmarks.plots import moe

    data = made_up_moe()
    rows = data["results"]["layer"]
    fig = plots.figure(data, "dark")
    assert fig is not None and fig._suptitle.get_text() == "Mixture-of-experts layer (qwen3-30b-a3b) on Made-up GPU"
    times_ax, share_ax = fig.axes
    assert times_ax.get_xscale() == share_ax.get_xscale() == "log" and times_ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in times_ax.get_lines()}
    for label, key in (("fused (in a CUDA graph)", "fused_us"), ("reference loop (eager)", "reference_us"),
                       ("bytes bound of the fused path", "bytes_bound_us")):
        assert list(lines[label].get_xdata()) == [1, 8, 64]
        assert list(lines[label].get_ydata()) == pytest.approx([r[key] for r in rows])
    share, target, bound = share_ax.get_lines()
    assert list(share.get_ydata()) == pytest.approx([0.8, 0.9, 0.9])
    assert list(target.get_ydata()) == [0.7, 0.7] and list(bound.get_ydata()) == [1.0, 1.0]
    labels = [t.get_text() for t in times_ax.texts + share_ax.texts]
    assert "fused: 50× faster" in labels and "80%" in labels and "target at batch size 1: 70%" in labels
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(lines)

    text = moe_text(data)
    assert table_row(text, "1", MOE_HEAD)[3:] == ["2,000 µs", "50×", "32 µs", "**80%**"]
    assert "**80%, reached**" in text and "**1.3×, reached**" in text
    assert "(median of 3 runs: 3.1, 3, 2.9 ms), 1.3× its roofline of 2.31 ms (6 GB read per step of 61 GB" in text
    assert moe.moe_section(common.BenchmarkResult("benchmarks/results/moe_x.json", data)) == text.splitlines()


def test_moe_targets_missed_or_not_judged() -> None:
    from benchmarks.plots import moe

    text = moe_text(made_up_moe(fraction_bs1=0.69, times_roofline=1.41))
    assert "**69%, not reached**" in text and "**1.41×, not reached**" in text
    data = made_up_moe(times_roofline=None)
    del data["results"]["layer"][0]  # no bs=1 row
    text = moe_text(data)
    assert "bytes bound or more: not judged (no batch-size-1 row)" in text
    assert "roofline: not judged (no roofline in the file)" in text and "; no roofline in the file." in text
    del data["results"]["decode_bs1"]
    text = moe_text(data)
    assert "not judged (no bs=1 decode in this run)" in text and "`python -m benchmarks moe --decode`" in text
    assert plots.figure(data, "light") is not None, "the layer rows alone are drawn"
    data["results"]["extra"] = 7
    assert "| extra | 7 |" in moe_text(data), "numbers the section does not know are still shown"
    # a decode run alone: its section, no chart
    only_decode = made_up_moe()
    del only_decode["results"]["layer"]
    lines = moe.moe_section(common.BenchmarkResult("benchmarks/results/moe_x.json", only_decode))
    assert lines is not None and "not judged (no batch-size-1 row)" in "\n".join(lines)
    assert moe.draw_moe(only_decode, common.THEMES["light"]) is None


@pytest.mark.parametrize("pdl, said", [(None, None), ("early", None), ("0", "PDL off"), ("off", "PDL off"),
                                       ("late", "PDL late")])
def test_moe_run_with_another_pdl_mode_says_so(pdl: str | None, said: str | None) -> None:
    """A run made with programmatic dependent launch other than the engine's default (``config.pdl``,
    ``MINISGL_PDL``) says so in its headline and in its targets line, which still judges its numbers;
    the default, or a file from before the key, says nothing of PDL."""
    data = made_up_moe(fraction_bs1=0.69, times_roofline=2.07)
    if pdl is not None:
        data["config"]["pdl"] = pdl
    text = moe_text(data)
    assert "**69%, not reached**" in text and "**2.07×, not reached**" in text
    if said is None:
        assert "PDL" not in text and "Targets of [lesson 11](../lessons/l11/README.md): " in text
    else:
        assert f"**{said}** (`MINISGL_PDL={pdl}`; the engine's default is early)" in text.splitlines()[0]
        assert (f"Targets of [lesson 11](../lessons/l11/README.md), judged on this run with {said} "
                "(not the engine's default): ") in text


def test_moe_launch_floor_line() -> None:
    """``--latency``: the launch floor against the router, in one line after the layer's parts;
    a part with a time missing or not positive is shown as the numbers it has, not as the line."""
    data = made_up_moe()
    data["results"]["latency_bs1"] = {"floor_one_number_kernel_us": 1.0, "router_us": 4.5,
                                      "router_with_pre_norm_us": 5.1, "calls_per_graph": 48}
    text = moe_text(data)
    line = ("**Launch floor** (`--latency`, inside a CUDA graph at bs=1): a one-program kernel that moves one number "
            "takes 1 µs a call; the decode router alone 4.5 µs (4.5× the floor), with its pre-norm step 5.1 µs: the "
            "rest is each kernel's own chain of dependent steps, not the launch.")
    assert text.count(line) == 1 and "calls_per_graph" not in text
    assert text.index(line) > text.index(MOE_HEAD) and text.index(line) < text.index("per token**")
    data["results"]["latency_bs1"]["router_us"] = 0
    text = moe_text(data)
    assert "Launch floor" not in text and "| latency_bs1 | 1 | 0 | 5.1 | 48 |" in text


@pytest.mark.parametrize("results", [None, [], {"layer": []}, {"layer": "rows"},
                                     {"layer": [{"batch_size": 1, "fused_us": "fast"}, 3], "decode_bs1": {"ms_per_token": 0}},
                                     {"parallel": 3}, {"parallel": {"sides": []}},
                                     {"parallel": {"sides": {"tp2": {"decode_bs1_ms": 0}, "one_gpu": "fast"}}}])
def test_malformed_moe_file_gets_generic_tables(results: object) -> None:
    from benchmarks.plots import moe

    data = {"benchmark": "moe", "results": results}
    res = common.BenchmarkResult("benchmarks/results/moe_x.json", data)
    assert moe.moe_section(res) is None and moe.draw_moe(data, common.THEMES["light"]) is None
    assert plots.figure(data) is None and plots.svgs(res) == {}
    text = plots.results_markdown([res])
    assert "![" not in text and "Targets of" not in text
    assert "\n".join(common._generic_tables(data)) in text, "the generic tables instead"


# The newer parts of a moe file (``--gemv-tiles``, ``--decode``): the layer's two forms side by
# side, the matrix-vector form's tiles and crossover, each form's kernels at bs=1, a bs=1 decode
# step's kernels by kind and the expert load.

KERNEL_LABELS = {"_group_kernel": "grouping", "_gate_up_kernel": "gate/up", "_gate_up_gemv_kernel": "gate/up",
                 "_down_kernel": "down", "_down_gemv_kernel": "down", "_down_gemv_sum_kernel": "down + top-k sum",
                 "_sum_top_k_kernel": "top-k sum"}


def subfig_titles(fig) -> list[list[str]]:
    return [[ax.get_title(loc="left") for ax in sub.axes] for sub in fig.subfigs]


def named_lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def check_newer_parts(text: str, data: dict) -> None:
    """The section of a committed file, part by part, as far as the file has each part."""
    results = data["results"]
    decode = results.get("decode_bs1", {})
    if "gemv_choice" in results:
        limit = results["gemv_choice"]["gemv_max_tokens"]
        after = min(r["batch_size"] for r in results["layer"] if r["batch_size"] > limit)
        assert (f"**Chosen in this run** (`--gemv-tiles`): the matrix-vector form up to {limit} tokens, the grouped one "
                f"from {after} (the next batch size measured).") in text
        for row in results["layer"]:
            assert row["path"] == ("gemv" if row["batch_size"] <= limit else "grouped")
    if "kernels_bs1" in results:
        head = next(line for line in text.splitlines() if line.startswith("| kernel | grouped |"))
        per_label: dict[str, dict[str, float]] = {}
        for form, kernels in results["kernels_bs1"].items():
            for name, us in kernels.items():
                per_label.setdefault(KERNEL_LABELS[name], {})[form] = us
        for label, forms in per_label.items():
            assert table_row(text, label, head) == [common._number(forms[f], "µs") if f in forms else "—"
                                                    for f in results["kernels_bs1"]]
        assert table_row(text, "**all kernels**", head) == [
            f"**{common._number(sum(k.values()), 'µs')}**" for k in results["kernels_bs1"].values()]
    else:
        assert "**The two forms at batch size 1**" not in text
    if "gemv_tiles_bs1" in results:
        tried = results["gemv_tiles_bs1"]
        assert f"over {len(tried)} tries" in text and '??? info "Every tile tried"' in text
        for kernel in ("gate_up", "down"):
            best = min((r for r in tried if r["kernel"] == kernel), key=lambda r: r["us"])
            assert f"{KERNEL_LABELS[f'_{kernel}_kernel']} from {common._number(best['us'], 'µs')}" in text
    if "kernels" in decode:
        kinds = decode["kernels"]["by_kind"]
        head = next(line for line in text.splitlines() if line.startswith("| kind | kernels per step |"))
        total = sum(k["us_per_step"] for k in kinds.values())
        assert f"{common._number(decode['kernels']['kernels_per_step'])} kernels, {common._number(total, 'µs')} of" in text
        rows = [line for line in text.splitlines()[text.splitlines().index(head) + 2:] if line.startswith("| ")]
        assert [line.split(" | ")[0][2:] for line in rows] == sorted(kinds, key=lambda k: -kinds[k]["us_per_step"])
        for kind, k in kinds.items():
            cells = table_row(text, kind, head)
            assert cells[:3] == [common._number(k["kernels_per_step"]), common._number(k["us_per_step"], "µs"),
                                 f"{k['us_per_step'] / total:.0%}"]
            top = max(k["top_kernels_us_per_step"].items(), key=lambda item: item[1])
            assert cells[3].startswith("`") and f"` {common._number(top[1])}" in cells[3], "the costliest kernel first"
    if "expert_load" in decode:
        busiest = decode["expert_load"]["busiest_over_mean"]
        assert (f"the busiest expert of a layer got **{common._number(statistics.median(busiest))}×** its layer's mean "
                f"choices (the median over the layers; from {common._number(min(busiest))}× to "
                f"{common._number(max(busiest))}×)") in text
        assert f"{decode['expert_load']['requests']} requests" in text and "untrained" in text


def check_newer_drawing(fig, data: dict) -> None:
    """The chart of a committed file with layer rows: the older files' two panels alone; a file
    with the newer parts, those parts stacked under them, each drawn from the file's numbers."""
    results = data["results"]
    decode = results.get("decode_bs1", {})
    newer = "gemv_us" in results["layer"][0] or "kernels_bs1" in results or "kernels" in decode
    if not newer:
        assert not fig.subfigs and len(fig.axes) == 2, "an older file: the layer's two panels, as before"
        return
    titles = subfig_titles(fig)
    assert titles[0] == ["The MoE layer alone", "The fused path against its bytes bound"]
    times_ax = fig.subfigs[0].axes[0]
    lines = named_lines(times_ax)
    for key, label in (("grouped_us", "grouped"), ("gemv_us", "matrix-vector")):
        line = lines[f"fused, {label} form (in a CUDA graph)"]
        timed = [r for r in results["layer"] if key in r]
        assert list(line.get_ydata()) == pytest.approx([r[key] for r in timed])
        path = key.removesuffix("_us")
        assert line.get_markevery() == [i for i, r in enumerate(timed) if r["path"] == path], "filled: the form it runs"
    if "kernels_bs1" in results:
        kernels_ax = fig.subfigs[1].axes[-1]
        widths = [bar.get_width() for bar in kernels_ax.patches]
        assert widths == pytest.approx([us for k in results["kernels_bs1"].values() for us in k.values()])
        bs1 = next(r for r in results["layer"] if r["batch_size"] == 1)
        assert kernels_ax.get_lines()[0].get_xdata()[0] == pytest.approx(bs1["bytes_bound_us"])
    if "kernels" in decode:
        kinds_ax = next(sub.axes[0] for sub in fig.subfigs if "kernels by kind" in sub.axes[0].get_title(loc="left"))
        us = sorted((k["us_per_step"] for k in decode["kernels"]["by_kind"].values()), reverse=True)
        assert [bar.get_width() for bar in kinds_ax.patches] == pytest.approx(us)
    if "expert_load" in decode:
        layer_ax = fig.subfigs[-1].axes[1]
        assert [bar.get_height() for bar in layer_ax.patches] == pytest.approx(decode["expert_load"]["busiest_over_mean"])
        counts = decode["expert_load"]["counts"]
        hist_ax = fig.subfigs[-1].axes[0]
        assert sum(bar.get_height() for bar in hist_ax.patches) == sum(len(c) for c in counts), "every expert once"


def test_the_h200_file_holds_the_newer_parts() -> None:
    """The committed H200 run with the tile sweep (``--decode --gemv-tiles``, c8dbf5a): both
    forms up to 16 tokens, the matrix-vector form run up to 4, each form's kernels at bs=1, the
    decode step by kind, the expert load; drawn as four stacked parts."""
    data = json.loads((RESULTS / "moe_gemv_tiles_c8dbf5a_h200.json").read_text(encoding="utf-8"))
    results = data["results"]
    assert [r["batch_size"] for r in results["layer"] if "gemv_us" in r] == [1, 2, 4, 8, 16]
    assert results["gemv_choice"]["gemv_max_tokens"] == 4
    fig = plots.figure(data)
    assert fig._suptitle.get_text() == \
        "Mixture-of-experts layer and decode at batch size 1 (qwen3-30b-a3b) on NVIDIA H200"
    assert subfig_titles(fig)[1:] == [
        ["Both forms; matrix-vector up to 4 tokens", "Each form's kernels at batch size 1"],
        ["Decode at batch size 1: one step's kernels by kind"],
        ["Every expert's load", "The busiest expert of each layer (median 2.52×)"]]
    assert fig.subfigs[-1]._suptitle.get_text() == \
        "Expert load of 64 requests, 21,447 tokens: random weights, an untrained router"
    text = moe_text(data, {"light": "assets/h-light.svg"})
    assert text.count("](assets/h-light.svg#only-light)") == 1
    for key in ("gemv_choice", "gemv_tiles_bs1", "kernels_bs1", "counts", "busiest_over_mean"):
        assert key not in text, f"{key}: said in words and tables, not dumped"


def made_up_forms() -> dict:
    """:func:`made_up_moe` with the newer parts, round numbers: both forms at bs=1 and 8 (the
    matrix-vector one faster at 1 only, so the layer runs it up to 1 token), the grouped one
    alone at 64; each form's kernels at bs=1; two tiles tried per kernel and the choice; a decode
    step's kernels by kind (31 kernels, 3,000 µs, no total in the file); the expert load of 3
    layers of 4 experts, top-2 (no ``busiest_over_mean`` in the file: computed)."""
    data = made_up_moe()
    data["config"]["model_config"] = {"num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3}
    results = data["results"]
    one, eight, sixty_four = results["layer"]
    one.update(grouped_us=50.0, gemv_us=40.0, path="gemv")
    eight.update(grouped_us=200.0, gemv_us=250.0, path="grouped")
    sixty_four.update(grouped_us=500.0, path="grouped")

    def tiles(n: int, k: int, warps: int) -> dict:
        return {"block_n": n, "block_k": k, "num_warps": warps, "num_stages": 3}

    results["kernels_bs1"] = {
        "grouped": {"_group_kernel": 5.0, "_gate_up_kernel": 20.0, "_down_kernel": 15.0, "_sum_top_k_kernel": 2.0},
        "gemv": {"_gate_up_gemv_kernel": 18.0, "_down_gemv_kernel": 14.0, "_sum_top_k_kernel": 2.0}}
    results["gemv_tiles_bs1"] = [
        {"kernel": "gate_up", "tiles": tiles(16, 256, 2), "us": 40.0, "fraction_of_bytes_bound": 0.8},
        {"kernel": "gate_up", "tiles": tiles(8, 64, 4), "us": 80.0, "fraction_of_bytes_bound": 0.4},
        {"kernel": "down", "tiles": tiles(32, 256, 2), "us": 50.0, "fraction_of_bytes_bound": 0.64},
        {"kernel": "down", "tiles": tiles(8, 128, 4), "us": 64.0, "fraction_of_bytes_bound": 0.5}]
    results["gemv_choice"] = {"gate_up_tiles": tiles(16, 256, 2), "down_tiles": tiles(32, 256, 2), "gemv_max_tokens": 1}
    decode = results["decode_bs1"]
    decode["kernels"] = {"steps": 10, "by_kind": {
        "matmul": {"kernels_per_step": 10.0, "us_per_step": 1000.0,
                   "top_kernels_us_per_step": {"copy": 100.0, "void gemv<128>(float*)": 900.0}},
        "MoE: experts (Triton)": {"kernels_per_step": 20.0, "us_per_step": 1500.0,
                                  "top_kernels_us_per_step": {"_gate_up_gemv_kernel": 1000.0}},
        "sampling": {"kernels_per_step": 1.0, "us_per_step": 500.0}}}
    decode["expert_load"] = {"requests": 2, "prompt_lengths": [10, 20], "new_tokens": 3,
                             "counts": [[4, 4, 4, 4], [8, 4, 2, 2], [1, 1, 1, 13]], "note": "random weights"}
    return data


def test_moe_newer_parts_drawn_from_a_made_up_result() -> None:
    """Four parts stacked: the layer with a line per form (filled markers where the layer runs
    it), both forms' bars with the bytes bound and each form's kernels at bs=1, the decode step's
    kinds (most time first), the expert load (every expert's share of its layer's mean, each
    layer's busiest); the section's table with a column per form, the choice, the kernels, the
    tiles, the kinds and the load line."""
    from benchmarks.plots import moe

    data = made_up_forms()
    fig = plots.figure(data, "dark")
    assert fig._suptitle.get_text() == "Mixture-of-experts layer and decode at batch size 1 (qwen3-30b-a3b) on Made-up GPU"
    assert subfig_titles(fig) == [
        ["The MoE layer alone", "The fused path against its bytes bound"],
        ["Both forms; matrix-vector up to 1 token", "Each form's kernels at batch size 1"],
        ["Decode at batch size 1: one step's kernels by kind"],
        ["Every expert's load", "The busiest expert of each layer (median 2×)"]]
    times_ax, share_ax = fig.subfigs[0].axes
    lines = named_lines(times_ax)
    assert list(lines) == ["fused, grouped form (in a CUDA graph)", "fused, matrix-vector form (in a CUDA graph)",
                           "reference loop (eager)", "bytes bound of the fused path"]
    grouped, gemv = lines["fused, grouped form (in a CUDA graph)"], lines["fused, matrix-vector form (in a CUDA graph)"]
    assert list(grouped.get_ydata()) == [50.0, 200.0, 500.0] and grouped.get_markevery() == [1, 2]
    assert list(gemv.get_xdata()) == [1, 8] and list(gemv.get_ydata()) == [40.0, 250.0] and gemv.get_markevery() == [0]
    hollow = [line for line in times_ax.get_lines() if line.get_label().startswith("_")]
    assert [(list(h.get_xdata()), h.get_markerfacecolor()) for h in hollow] == [([1], "none"), ([8], "none")]
    shares = named_lines(share_ax)
    assert list(shares["grouped form"].get_ydata()) == pytest.approx([32 / 50, 0.9, 0.9])
    assert list(shares["matrix-vector form"].get_ydata()) == pytest.approx([0.8, 180 / 250])
    legend = [t.get_text() for t in fig.subfigs[0].legends[0].get_texts()]
    assert legend == list(lines) + ["hollow: a form the layer does not run there"]

    bars_ax, kernels_ax = fig.subfigs[1].axes
    assert [b.get_height() for b in bars_ax.patches] == [50.0, 200.0, 40.0, 250.0], "grouped at 1 and 8, then gemv"
    assert [b.get_alpha() for b in bars_ax.patches] == [0.4, 1.0, 1.0, 0.4], "solid: the form the layer runs"
    assert [t.get_text() for t in bars_ax.get_xticklabels()] == ["1", "8"]
    assert [b.get_width() for b in kernels_ax.patches] == [5.0, 20.0, 15.0, 2.0, 18.0, 14.0, 2.0]
    assert [t.get_text() for t in kernels_ax.get_yticklabels()] == ["grouped", "matrix-vector"]
    assert {"42 µs", "34 µs", "bytes bound 32 µs"} <= {t.get_text() for t in kernels_ax.texts}
    assert [t.get_text() for t in kernels_ax.get_legend().get_texts()] == ["grouping", "gate/up", "down", "top-k sum"]

    kinds_ax = fig.subfigs[2].axes[0]
    assert [b.get_width() for b in kinds_ax.patches] == [1500.0, 1000.0, 500.0]
    assert [t.get_text() for t in kinds_ax.get_yticklabels()] == ["MoE: experts (Triton)", "matmul", "sampling"]
    texts = [t.get_text() for t in kinds_ax.texts]
    assert texts[:3] == ["1,500 µs · 20 kernels", "1,000 µs · 10 kernels", "500 µs · 1 kernel"]
    assert texts[3] == "31 kernels, 3,000 µs per step\n3 ms per token; roofline 2.31 ms"
    colors = [b.get_facecolor() for b in kinds_ax.patches]
    assert colors[0] != colors[1] == colors[2], "the MoE kernels stand out"

    hist_ax, layer_ax = fig.subfigs[3].axes
    assert sum(b.get_height() for b in hist_ax.patches) == 12, "every expert of every layer once"
    assert [b.get_height() for b in layer_ax.patches] == pytest.approx([1.0, 2.0, 3.25]), "computed: max over mean"
    assert fig.subfigs[3]._suptitle.get_text() == "Expert load of 2 requests, 8 tokens: random weights, an untrained router"

    text = moe_text(data, {"light": "assets/f-light.svg"})
    assert text.count("](assets/f-light.svg#only-light)") == 1
    assert "the grouped and matrix-vector forms at small batch sizes" in text and "the expert load" in text
    assert table_row(text, "1", MOE_FORMS_HEAD) == ["8", "96 MB", "50 µs", "**40 µs**", "2,000 µs", "50×", "32 µs",
                                                    "**80%**"]
    assert table_row(text, "8", MOE_FORMS_HEAD)[2:4] == ["**200 µs**", "250 µs"]
    assert table_row(text, "64", MOE_FORMS_HEAD)[2:4] == ["**500 µs**", "—"]
    assert "the matrix-vector one timed up to 8 tokens; in bold the one the layer runs" in text
    assert ("**Chosen in this run** (`--gemv-tiles`): the matrix-vector form up to 1 token, the grouped one from 8 (the "
            "next batch size measured). Its tiles: gate/up 16 × 256, 2 warps, 3 stages; down 32 × 256, 2 warps, 3 "
            "stages.") in text
    head = "| kernel | grouped | matrix-vector |"
    assert "(profiled over eager calls; the bytes bound there is 32 µs):" in text
    assert table_row(text, "grouping", head) == ["5 µs", "—"] and table_row(text, "gate/up", head) == ["20 µs", "18 µs"]
    assert table_row(text, "top-k sum", head) == ["2 µs", "2 µs"]
    assert table_row(text, "**all kernels**", head) == ["**42 µs**", "**34 µs**"]
    assert ("over 4 tries: gate/up from 40 µs (16 × 256, 2 warps, 3 stages; 80% of the bytes bound) to 80 µs; down from "
            "50 µs (32 × 256, 2 warps, 3 stages; 64% of the bytes bound) to 64 µs.") in text
    assert "    | down | 8 × 128, 4 warps, 3 stages | 64 µs | 50% |" in text, "every tile, folded away"
    assert ("**One bs=1 decode step's kernels by kind** (profiled over 10 steps): 31 kernels, 3,000 µs of kernel time "
            "per step, 100% of the 3 ms per token") in text
    kinds_head = next(line for line in text.splitlines() if line.startswith("| kind |"))
    assert table_row(text, "MoE: experts (Triton)", kinds_head) == ["20", "1,500 µs", "50%", "`_gate_up_gemv_kernel` 1,000"]
    assert table_row(text, "matmul", kinds_head) == ["10", "1,000 µs", "33%", "`gemv` 900, `copy` 100"]
    assert table_row(text, "sampling", kinds_head) == ["1", "500 µs", "17%", "—"]
    assert ("**Expert load** of a workload (2 requests; prompts of 10–20 random tokens; 3 new tokens each; 8 tokens, "
            "each choosing 2 of 4 experts in each of 3 layers): the busiest expert of a layer got **2×** its layer's "
            "mean choices (the median over the layers; from 1× to 3.25×), the idlest 0.5× (median). Random weights.") \
        in text
    for key in ("gemv_choice", "gemv_tiles_bs1", "kernels_bs1", "counts"):
        assert key not in text
    assert moe.moe_section(common.BenchmarkResult("benchmarks/results/moe_x.json", data, {"light": "assets/f-light.svg"})) \
        == text.splitlines()
    svgs = common.render_svgs(plots.KINDS["moe"][0], common.BenchmarkResult("benchmarks/results/moe_x.json", data))
    assert set(svgs) == {"light", "dark"}


def test_moe_newer_parts_each_alone() -> None:
    """Each newer part without the others: the file's busiest-over-mean where it has one; a
    choice of no matrix-vector tokens; the kernels at bs=1 without the forms' rows; the decode
    parts without layer rows (drawn alone, the chart after the decode line); parts of the wrong
    shape ignored (the older chart, the values in the generic tables)."""
    data = made_up_forms()
    data["results"]["decode_bs1"]["expert_load"]["busiest_over_mean"] = [1.1, 1.2, 1.3]
    data["results"]["gemv_choice"]["gemv_max_tokens"] = 0
    fig = plots.figure(data)
    assert [b.get_height() for b in fig.subfigs[3].axes[1].patches] == pytest.approx([1.1, 1.2, 1.3])
    assert fig.subfigs[1].axes[0].get_title(loc="left") == "Both forms; grouped at every batch size"
    text = moe_text(data)
    assert "got **1.2×** its layer's mean choices (the median over the layers; from 1.1× to 1.3×)" in text
    assert "**Chosen in this run** (`--gemv-tiles`): the grouped form at every batch size. Its tiles:" in text

    kernels_only = made_up_moe()
    kernels_only["results"]["kernels_bs1"] = made_up_forms()["results"]["kernels_bs1"]
    fig = plots.figure(kernels_only)
    assert subfig_titles(fig) == [["The MoE layer alone", "The fused path against its bytes bound"],
                                  ["Each form's kernels at batch size 1"]]
    assert fig._suptitle.get_text() == "Mixture-of-experts layer (qwen3-30b-a3b) on Made-up GPU"
    text = moe_text(kernels_only)
    assert MOE_HEAD in text and "| kernel | grouped | matrix-vector |" in text and "Chosen in this run" not in text

    forms_only = made_up_forms()
    for key in ("kernels_bs1", "gemv_tiles_bs1", "gemv_choice"):
        del forms_only["results"][key]
    for key in ("kernels", "expert_load"):
        del forms_only["results"]["decode_bs1"][key]
    fig = plots.figure(forms_only)
    assert subfig_titles(fig)[1] == ["Both forms; solid: the one the layer runs"]
    assert "**The two forms at batch size 1**" not in moe_text(forms_only)

    decode_only = made_up_forms()
    for key in ("layer", "kernels_bs1", "gemv_tiles_bs1", "gemv_choice"):
        del decode_only["results"][key]
    fig = plots.figure(decode_only)
    assert fig._suptitle.get_text() == "Mixture-of-experts decode at batch size 1 (qwen3-30b-a3b) on Made-up GPU"
    assert [len(sub.axes) for sub in fig.subfigs] == [1, 2]
    lines = moe_text(decode_only, {"light": "assets/d-light.svg"}).splitlines()
    decode_line = next(i for i, line in enumerate(lines) if line.startswith("**Decode at batch size 1**"))
    assert lines[decode_line + 2].startswith("![a batch-size-1 decode step's kernel time by kind; the expert load")
    assert "Targets of" in lines[2] and MOE_HEAD not in "\n".join(lines)

    broken = made_up_moe()
    broken["results"].update(kernels_bs1={"grouped": "fast"}, gemv_tiles_bs1=[1, {"kernel": "down"}],
                             gemv_choice={"gemv_max_tokens": "4"})
    broken["results"]["decode_bs1"].update(kernels={"by_kind": {"matmul": 3}}, expert_load={"counts": [[0, 0]]})
    fig = plots.figure(broken)
    assert not fig.subfigs and len(fig.axes) == 2, "nothing newer to draw: the older chart"
    text = moe_text(broken)
    assert "kernels_bs1" in text and "gemv_tiles_bs1" in text and "gemv_choice" in text, "shown as generic tables"
    assert "**Expert load**" not in text and "kernels by kind" not in text


def test_the_decode_down_kernel_that_sums_the_top_k_has_its_own_label() -> None:
    """The matrix-vector form's down kernel adds the top-k itself (``_down_gemv_sum_kernel``):
    labelled as both, after gate/up, not as a raw kernel name; older files keep their labels."""
    from benchmarks.plots import moe

    data = {"results": {"kernels_bs1": {"gemv": {"_gate_up_gemv_kernel": 16.0, "_down_gemv_sum_kernel": 9.0},
                                        "grouped": {"_down_kernel": 9.0, "_sum_top_k_kernel": 2.0}}}}
    kernels = moe._layer_kernels(data)
    assert kernels == {"gemv": {"gate/up": 16.0, "down + top-k sum": 9.0}, "grouped": {"down": 9.0, "top-k sum": 2.0}}
    assert moe._kernel_order(kernels) == ["gate/up", "down", "down + top-k sum", "top-k sum"]


def test_the_decode_routers_tile_sweep_is_a_sentence_and_a_folded_table_not_a_leftover() -> None:
    """``results.router_tiles_bs1`` (``moe --gemv-tiles``): the fastest and slowest of the router's
    tile choices in words, every choice in a folded table, and no generic table of dotted keys."""
    data = json.loads((RESULTS / "moe_gemv_tiles_c8dbf5a_h200.json").read_text(encoding="utf-8"))
    router = data["results"]["router_tiles_bs1"]
    text = moe_text(data)
    best = min(router, key=lambda r: r["us"])
    assert (f"over {len(router)} tile choices: from {common._number(best['us'], 'µs')} "
            f"({best['tiles']['block_n']} × {best['tiles']['block_k']}, {best['tiles']['num_warps']} warp") in text
    assert '??? info "Every router tile tried"' in text and "tiles.block_n" not in text
