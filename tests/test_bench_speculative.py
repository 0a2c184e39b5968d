"""``python -m benchmarks speculative`` (lesson 12) and the drawing of its results.

The runner: a quick CPU run of every part on the demo model (the n-gram proposer, and a draft
model that does not exist, skipped with its reason), each part's numbers consistent with the
others; the per-step counts and the projection from forward costs on made-up inputs. The
drawing: a made-up CPU-like and GPU-like result (every table row, the chart's lines, bars and
legends, the comparison table's rows), malformed files (generic tables, no chart), and the
committed files, CPU and GPU (each part's rows against the file)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks.speculative import main, project, step_counts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("speculative") / "speculative.json"
    main(["--quick", "--device", "cpu", "--threads", "1", "--proposers", "ngram,draft",
          "--draft-model", str(out.parent / "no-such-draft"), "--out", str(out)])
    return json.loads(out.read_text())


def test_quick_run_acceptance_rows_add_up(quick_run: dict) -> None:
    assert quick_run["benchmark"] == "speculative" and quick_run["config"]["quick"] is True
    results = quick_run["results"]
    assert "draft" in results["skipped_proposers"], "a draft model that is not there is skipped, with its reason"
    rows = results["acceptance"]["rows"]
    assert {(r["proposer"], r["k"]) for r in rows} == {("ngram", 1), ("ngram", 4)}
    for k in (1, 4):
        by = {r["workload"]: r for r in rows if r["k"] == k}
        assert set(by) == {"chat", "prose", "all"}
        for key in ("requests", "decode_steps", "decode_tokens", "drafted", "accepted", "identical_to_plain"):
            assert by["all"][key] == by["chat"][key] + by["prose"][key]
        for r in by.values():
            # each decode step adds its accepted drafts plus one (fewer only where a stop token cut the run)
            assert r["decode_steps"] <= r["decode_tokens"] <= r["decode_steps"] + r["accepted"]
            assert r["tokens_per_step"] == pytest.approx(r["decode_tokens"] / r["decode_steps"])
            assert sum(r["steps_by_drafts"].values()) == r["decode_steps"]
            assert sum(r["verify_steps_by_accepted"].values()) == r["verify_steps"]
            assert max(int(d) for d in r["steps_by_drafts"]) <= k
            assert r["identical_to_plain"] == r["requests"], "greedy float32 on the CPU: the plain engine's tokens"


def test_quick_run_speedup_verify_and_throughput(quick_run: dict) -> None:
    results = quick_run["results"]
    speedup = results["speedup"]["engines"]
    assert set(speedup) == {"off", "ngram"}
    assert speedup["ngram"]["identical_to_off"] == results["speedup"]["prompts"] == 2
    s = speedup["ngram"]["speedup_vs_off"]
    assert len(s["runs"]) == 2 and s["min"] <= s["median"] <= s["max"]

    demo = results["verify_cost"]["shapes"]["demo"]
    assert {(r["batch_size"], r["k"]) for r in demo["rows"]} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    for r in demo["rows"]:
        assert r["cost_vs_eager_decode"] == pytest.approx(r["verify_ms"] / r["decode_eager_ms"])
        assert "decode_graph_ms" not in r, "no CUDA graphs on the CPU"
    assert results["verify_cost"]["acceptance_source"].startswith("this run's acceptance part")
    assert all(p["proposer"] == "ngram" for p in demo["projected"])

    shapes = results["throughput"]["shapes"]
    assert list(shapes) == ["demo"], "the random-weight shapes need a GPU: skipped on the CPU"
    rows = shapes["demo"]["rows"]
    assert [r["batch_size"] for r in rows] == [1, 2]
    for r in rows:
        assert r["ngram"]["identical_to_off"] == r["requests"] == 2
        assert r["ngram"]["output_tokens"] == r["off"]["output_tokens"]


def test_quick_run_is_drawn(quick_run: dict) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots
    from benchmarks.plots import common

    res = common.BenchmarkResult("benchmarks/results/speculative_x.json", quick_run)
    text = "\n".join(plots.KINDS["speculative"][1](res))
    assert "**Tokens per decode step**" in text and "**Batch size 1, wall clock**" in text
    assert "**The verify step's cost**" in text and "**Throughput against batch size**" in text
    assert "Not measured in this run: `draft`" in text
    fig = plots.figure(quick_run)
    assert fig is not None and sum(ax.get_visible() for ax in fig.axes) == 4


def test_step_counts() -> None:
    # two requests: the first entry is the prefill's token; then (drafts, accepted) per decode step
    drafted = [[0, 4, 0, 4], [0, 2]]
    accepted = [[0, 4, 0, 1], [0, 0]]
    outputs = [[1] * (1 + 5 + 1 + 2), [2, 3]]
    c = step_counts(drafted, accepted, outputs)
    assert c["decode_steps"] == 4 and c["decode_tokens"] == 9 and c["tokens_per_step"] == 9 / 4
    assert (c["drafted"], c["accepted"], c["verify_steps"]) == (10, 5, 3)
    assert c["acceptance_rate"] == 0.5
    assert c["steps_by_drafts"] == {"0": 1, "2": 1, "4": 2}
    assert c["verify_steps_by_accepted"] == {"0": 1, "1": 1, "4": 1}


def test_projection_prices_each_step_by_its_drafts() -> None:
    entry = {"rows": [{"batch_size": 1, "k": k, "verify_ms": 1.0 + 0.1 * k, "decode_eager_ms": 1.0,
                       "decode_graph_ms": 0.5} for k in (1, 2)]}
    acceptance = [{"proposer": "ngram", "k": 2, "workload": "all", "tokens_per_step": 1.5, "decode_tokens": 6,
                   "steps_by_drafts": {"0": 2, "2": 2}},
                  {"proposer": "ngram", "k": 2, "workload": "chat", "tokens_per_step": 1.0}]
    (row,) = project(entry, acceptance)
    spec_ms = 2 * 1.0 + 2 * 1.2  # two plain (eager) steps, two verify steps of 1 + 2 tokens
    assert row["speedup_vs_eager_decode"] == pytest.approx(6 * 1.0 / spec_ms)
    assert row["speedup_vs_graphed_decode"] == pytest.approx(6 * 0.5 / spec_ms)
    acceptance[0]["steps_by_drafts"]["3"] = 1  # a draft count that was not timed: no projection
    assert project(entry, acceptance) == []


# --- drawing --------------------------------------------------------------------------------------

def spread(median: float, lo: float, hi: float) -> dict:
    return {"median": median, "min": lo, "max": hi, "runs": [lo, median, hi]}


def made_up(gpu: bool = False) -> dict:
    """A result with round numbers: acceptance for two proposers at k = 1, 2, 4; the bs=1
    speed-ups; verify costs of one or two models; throughput at bs = 1, 4, 16."""
    rows = []
    for proposer, base in (("ngram", 1.1), ("draft", 1.5)):
        for k in (1, 2, 4):
            for workload, extra in (("chat", 0.0), ("prose", 0.2), ("all", 0.1)):
                rows.append({"proposer": proposer, "k": k, "workload": workload, "requests": 4,
                             "tokens_per_step": base + extra + 0.1 * k, "drafted": 100, "accepted": 25 * k // 2,
                             "acceptance_rate": k / 8, "identical_to_plain": 4, "decode_tokens": 100,
                             "steps_by_drafts": {"0": 10, str(k): 40}})
    engines = {"off": {"output_tok_s": spread(100.0, 90.0, 110.0), "identical_to_off": 6},
               "ngram": {"output_tok_s": spread(120.0, 110.0, 130.0), "identical_to_off": 6, "tokens_per_step": 1.5,
                         "speedup_vs_off": spread(1.2, 1.1, 1.3)},
               "draft": {"output_tok_s": spread(150.0, 140.0, 160.0), "identical_to_off": 6, "tokens_per_step": 2.0,
                         "speedup_vs_off": spread(1.5, 1.4, 1.6)}}
    if gpu:
        engines["off_eager"] = {"output_tok_s": spread(50.0, 45.0, 55.0), "identical_to_off": 6,
                                "speedup_vs_off": spread(0.5, 0.45, 0.55)}
        for key, v in (("ngram", 2.4), ("draft", 3.0)):
            engines[key]["speedup_vs_off_eager"] = spread(v, v - 0.1, v + 0.1)
    verify = {}
    for name in (("demo", "qwen3-0.6b") if gpu else ("demo",)):
        vrows = []
        for bs in ((1, 8) if gpu else (1,)):
            for k in (1, 2, 4):
                r = {"batch_size": bs, "k": k, "verify_ms": 1.0 + 0.1 * k * bs, "decode_eager_ms": 1.0}
                if gpu:
                    r["decode_graph_ms"] = 0.8
                vrows.append(r)
        projected = [{"proposer": "ngram", "k": k, "batch_size": bs, "tokens_per_step": 1.3,
                      "speedup_vs_eager_decode": 1.2 / k, **({"speedup_vs_graphed_decode": 1.0 / k} if gpu else {})}
                     for k in (1, 2, 4) for bs in ((1, 8) if gpu else (1,))]
        verify[name] = {"model": name, "dummy_weights": name != "demo", "context": 512, "rows": vrows,
                        "projected": projected}
    trows = []
    for bs, ratio in ((1, 1.3), (4, 1.05), (16, 0.8)):
        trows.append({"batch_size": bs, "requests": max(bs, 8),
                      "off": {"output_tok_s": spread(100.0 * bs, 90.0 * bs, 110.0 * bs)},
                      "ngram": {"output_tok_s": spread(100.0 * bs * ratio, 90.0 * bs * ratio, 110.0 * bs * ratio),
                                "tokens_per_step": 1.4, "speedup_vs_off": spread(ratio, ratio - 0.05, ratio + 0.05)}})
    tshapes = {"demo": {"model": "demo", "k": 4, "repeats": 2, "max_tokens": 32, "prompt": "chat and prose", "rows": trows}}
    if gpu:  # a random-weights model too: its n-gram acceptance said beside it
        rrows = copy.deepcopy(trows)
        for r, rate in zip(rrows, (0.6, 0.65, 0.7)):
            r["ngram"]["acceptance_rate"] = rate
        tshapes["qwen3-0.6b"] = {"model": "qwen3-0.6b", "dummy_weights": True, "k": 4, "rows": rrows}
    config = {"model": "demo", "device": "cuda" if gpu else "cpu", "greedy": True}
    if gpu:
        config["plain_engine"] = "the defaults; speculation runs without graphs"
    return {"benchmark": "speculative", "hardware": {"gpu": "Made-up GPU"} if gpu else {"cpu": "x86_64", "cpu_count": 2},
            "commit": "abc1234", "config": config,
            "results": {"acceptance": {"max_tokens": 64, "rows": rows},
                        "speedup": {"k": 4, "prompts": 6, "repeats": 5, "engines": engines},
                        "verify_cost": {"reps": 20, "acceptance_source": "this run", "shapes": verify},
                        "throughput": {"shapes": tshapes}}}


def section_text(data: dict, rel: str = "benchmarks/results/speculative_x.json") -> str:
    from benchmarks.plots import common, speculative

    lines = speculative.speculative_section(common.BenchmarkResult(rel, data, {"light": "assets/s-light.svg"}))
    assert lines is not None
    return "\n".join(lines)


def table_row(text: str, first_cells: list[str], after: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    for line in lines[start:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[:len(first_cells)] == first_cells:
            return cells[len(first_cells):]
    raise AssertionError(f"no row {first_cells} after {after!r} in:\n{text}")


def test_made_up_cpu_result_tables() -> None:
    pytest.importorskip("matplotlib")
    text = section_text(made_up())
    assert "](assets/s-light.svg#only-light)" in text
    assert table_row(text, ["`ngram`", "2"], "**Tokens per decode step**") == ["1.3", "1.5", "**1.4**", "25 of 100 (25%)",
                                                                                "4 of 4"]
    assert table_row(text, ["`draft`", "4"], "**Tokens per decode step**")[2] == "**2**"
    assert table_row(text, ["n-gram proposer"], "**Batch size 1") == ["120", "**1.2×** (1.1–1.3)", "1.5", "6 of 6"]
    assert table_row(text, ["without speculation"], "**Batch size 1") == ["100", "—", "1", "6 of 6"]
    assert "5 interleaved repeats" in text
    assert table_row(text, ["4"], "| k | verify forward") == ["1.4 ms", "1.4×", "0.3×"]
    assert table_row(text, ["16"], "**Throughput") == ["16", "1,600", "1,280", "0.8× (0.75–0.85)", "1.4"]
    assert table_row(text, ["1"], "**Throughput")[3] == "**1.3×** (1.25–1.35)"
    assert "N-gram proposer: faster than without speculation up to batch size 4 (median)." in text
    assert "graphed" not in text.split("**The verify step's cost**")[1].split("\n\n")[1], "no graphs on a CPU run"
    assert "The engine without speculation" not in text, "not in this file's config"
    from benchmarks import plots

    fig = plots.figure(made_up())
    _, speedup, verify, _ = fig.axes
    assert [t.get_text() for t in speedup.get_xticklabels()] == ["n-gram proposer", "draft model"]
    assert [t.get_text() for t in verify.get_legend().get_texts()] == ["demo, over the eager decode"]


def test_made_up_gpu_result_tables_and_chart() -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    data = made_up(gpu=True)
    text = section_text(data)
    assert table_row(text, ["n-gram proposer"], "**Batch size 1")[2] == "2.4× (2.3–2.5)", "over the engine with graphs off"
    assert table_row(text, ["without speculation, CUDA graphs off"], "**Batch size 1")[1] == "0.5× (0.45–0.55)"
    assert "*qwen3-0.6b* (random weights), 1 row, context 512: decode forward 1 ms eager, 0.8 ms graphed" in text
    assert table_row(text, ["2"], "*qwen3-0.6b*") == ["1.2 ms", "1.2×", "1.5×", "0.6×", "0.5×"]
    by_batch = text.split("*qwen3-0.6b*")[1]
    assert table_row(by_batch, ["8"], "Verify forward over the graphed decode") == ["1 ms", "0.8 ms", "2.25×", "3.25×", "5.25×",
                                                                                    "1×", "0.5×", "0.25×"]

    fig = plots.figure(data, "dark")
    acceptance, speedup, verify, throughput = fig.axes
    lines = {line.get_label(): line for line in acceptance.get_lines()}
    assert list(lines["n-gram proposer"].get_xdata()) == [1, 2, 4]
    assert list(lines["draft model"].get_ydata()) == pytest.approx([1.7, 1.8, 2.0])
    assert {"n-gram proposer, chat", "draft model, prose"} <= set(lines)
    heights = [p.get_height() for p in speedup.patches]
    assert heights == pytest.approx([1.2, 2.4, 1.5, 3.0, 0.5])
    ticks = [t.get_text() for t in speedup.get_xticklabels()]
    assert ticks == ["n-gram\nproposer", "n-gram\nover\ngraphs off", "draft\nmodel", "draft\nover\ngraphs off",
                     "without\nspeculation,\ngraphs off"], "five bars: short labels on several lines"
    vlines = {line.get_label(): line for line in verify.get_lines()}
    assert list(vlines["qwen3-0.6b, over the graphed decode"].get_ydata()) == pytest.approx([1.1 / 0.8, 1.2 / 0.8, 1.4 / 0.8])
    legend = [t.get_text() for t in verify.get_legend().get_texts()]
    assert legend == ["demo", "qwen3-0.6b", "over the eager decode", "over the graphed decode"], \
        "several models: a colour per model, a line style per ratio"
    ratio = throughput.get_lines()[0]
    assert list(ratio.get_xdata()) == [1, 4, 16] and list(ratio.get_ydata()) == pytest.approx([1.3, 1.05, 0.8])
    assert [line.get_label() for line in throughput.get_lines()][:2] == ["n-gram proposer, demo", "n-gram proposer, qwen3-0.6b"]
    assert fig._suptitle.get_text() == "Speculative decoding (demo) on Made-up GPU"
    assert "The engine without speculation: the defaults; speculation runs without graphs." in text
    assert ("*qwen3-0.6b* (random weights: its greedy text repeats itself, so prompt lookup finds more to draft than in "
            "real text: a best case for the n-gram proposer; drafts accepted: n-gram proposer 60–70%)") in text


def test_comparison_has_a_row_per_file_and_proposer() -> None:
    from benchmarks.plots import common, speculative

    results = [common.BenchmarkResult("benchmarks/results/speculative_demo_cpu.json", made_up()),
               common.BenchmarkResult("benchmarks/results/speculative_gpu.json", made_up(gpu=True)),
               common.BenchmarkResult("benchmarks/results/moe_gpu.json", {"benchmark": "moe", "results": {}})]
    table = speculative.speculative_comparison(results)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 4
    assert rows[0].startswith("| demo, CPU x86_64, 2 cores | `ngram` | 4 | 1.6 | **1.2×** (1.1–1.3) | 1.3× at 1 | 0.8× at 16 |")
    assert rows[3].startswith("| demo, Made-up GPU | `draft` | 4 | 2 | **1.5×** (1.4–1.6) | — | — |")
    assert speculative.speculative_comparison(results[2:]) == "_No speculative results committed yet._\n"


@pytest.mark.parametrize("results", [None, [], {"acceptance": {"rows": "x"}}, {"speedup": {"engines": {"ngram": {}}}},
                                     {"verify_cost": {"shapes": {"demo": {"rows": [{"k": 1}]}}}},
                                     {"throughput": {"shapes": {"demo": {"rows": [{"batch_size": 1, "off": 3}]}}}}])
def test_malformed_file_gets_generic_tables(results: object) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots
    from benchmarks.plots import common, speculative

    data = {"benchmark": "speculative", "results": results}
    res = common.BenchmarkResult("benchmarks/results/speculative_x.json", data)
    assert speculative.speculative_section(res) is None and plots.figure(data) is None and plots.svgs(res) == {}
    assert "\n".join(common._generic_tables(data)) in plots.results_markdown([res])


def test_parts_missing_still_draw() -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    data = made_up()
    for key in ("speedup", "verify_cost", "throughput"):
        del data["results"][key]
    fig = plots.figure(data)
    assert sum(ax.get_visible() for ax in fig.axes) == 1
    text = section_text(data)
    assert "**Tokens per decode step**" in text and "Batch size 1" not in text
    data = copy.deepcopy(made_up())
    data["results"]["extra"] = 7
    assert "| extra | 7 |" in section_text(data), "numbers the section does not know are still shown"


def speculative_results() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.json")
                  if json.loads(p.read_text(encoding="utf-8")).get("benchmark") == "speculative")


def test_there_are_speculative_results_to_draw() -> None:
    assert speculative_results(), "benchmarks/results/ should hold a speculative run"


@pytest.mark.parametrize("path", speculative_results(), ids=lambda p: p.stem)
def test_committed_results_are_drawn(path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots
    from benchmarks.plots import common

    data = json.loads(path.read_text(encoding="utf-8"))
    res = common.BenchmarkResult(path.relative_to(REPO).as_posix(), data)
    results = data["results"]
    text = section_text(data, res.rel)
    n = common._number
    for row in results.get("acceptance", {}).get("rows", []):
        if row["workload"] == "all":
            cells = table_row(text, [f"`{row['proposer']}`", str(row["k"])], "**Tokens per decode step**")
            assert f"**{n(row['tokens_per_step'])}**" in cells
            assert cells[-1] == f"{row['identical_to_plain']} of {row['requests']}"
    engines = results.get("speedup", {}).get("engines", {})
    names = {"off": "without speculation", "off_eager": "without speculation, CUDA graphs off",
             "ngram": "n-gram proposer", "draft": "draft model"}
    eager = any("speedup_vs_off_eager" in e for e in engines.values())
    for key, entry in engines.items():
        cells = table_row(text, [names[key]], "**Batch size 1")
        assert cells[0] == n(entry["output_tok_s"]["median"])
        if "speedup_vs_off" in entry:
            s = entry["speedup_vs_off"]
            assert cells[1].startswith(f"**{n(s['median'])}×**" if key != "off_eager" else f"{n(s['median'])}×")
        if eager and "speedup_vs_off_eager" in entry:
            assert cells[2].startswith(f"{n(entry['speedup_vs_off_eager']['median'])}×"), "over the engine with graphs off"
    for name, shape in results.get("verify_cost", {}).get("shapes", {}).items():
        first = min(r["batch_size"] for r in shape["rows"])
        block = text.split(f"\n*{name}*", 1)[1]  # the line that starts this model's verify tables
        for r in (r for r in shape["rows"] if r["batch_size"] == first):
            cells = table_row(block, [str(r["k"])], "| k | verify forward")
            assert cells[:2] == [n(r["verify_ms"], "ms"), f"{n(r['verify_ms'] / r['decode_eager_ms'])}×"]
            if "decode_graph_ms" in r:  # a GPU run: over the graphed decode too
                assert cells[2] == f"{n(r['verify_ms'] / r['decode_graph_ms'])}×"
        ceiling = any("ceiling" in str(p.get("proposer_cost", "")) for p in shape.get("projected", [])
                      if p["batch_size"] == first)
        assert ("projection leaves them out (a ceiling)" in block.split("\n*", 1)[0]) == ceiling, \
            "a projection without the draft model's forwards is said to be a ceiling"
    for name, shape in results.get("throughput", {}).get("shapes", {}).items():
        block = text.split(f"**Throughput against batch size**, *{name}*", 1)[1]
        for r in shape["rows"]:
            cells = table_row(block, [str(r["batch_size"])], "| batch size |")
            assert cells[1] == n(r["off"]["output_tok_s"]["median"])
            for key in ("ngram", "draft"):
                if key in r:
                    assert n(r[key]["speedup_vs_off"]["median"]) + "×" in " ".join(cells)
    svgs = common.render_svgs(plots.KINDS["speculative"][0], res)
    assert set(svgs) == {"light", "dark"} and all(svg.lstrip().startswith("<?xml") for svg in svgs.values())
