"""``python -m benchmarks guard``: the regression guard's summary of the runs
``benchmarks/compare_trees.sh`` writes (CPU; the runs themselves need a GPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import guard


def _run(folder: Path, name: str, commit: str, results: dict) -> None:
    payload = {"benchmark": name.split("_")[0], "date": "2026-01-01T00:00:00", "commit": commit,
               "hardware": {"gpu": "NVIDIA H200"}, "config": {}, "results": results}
    (folder / f"{name}.json").write_text(json.dumps(payload))


def _moe(ms: float, layer_us: float | None = None) -> dict:
    results: dict = {"decode_bs1": {"ms_per_token": ms}}
    if layer_us is not None:
        results["layer"] = [{"batch_size": 1, "fused_us": layer_us}, {"batch_size": 2, "fused_us": 99.0}]
    return results


def test_times_compare_as_other_over_this_per_round(tmp_path: Path) -> None:
    _run(tmp_path, "moe_this_1", "new1234", _moe(2.80, 24.0))
    _run(tmp_path, "moe_other_1", "old1234", _moe(2.90, 25.0))
    _run(tmp_path, "moe_this_2", "new1234", _moe(2.80, 24.0))
    _run(tmp_path, "moe_other_2", "old1234", _moe(2.856, 24.0))
    s = guard.summarise(tmp_path)
    assert s["bench"] == "moe" and s["commits"] == {"this": "new1234", "other": "old1234"}
    g = s["this_over_other"]["qwen3-30b-a3b bs=1 decode ms"]
    assert g["rounds"] == 2 and g["min"] == pytest.approx(1.02) and g["max"] == pytest.approx(2.90 / 2.80)
    assert g["median"] == pytest.approx((1.02 + 2.90 / 2.80) / 2)
    layer = s["this_over_other"]["layer bs=1 fused ms"]
    assert layer["min"] == pytest.approx(1.0) and layer["max"] == pytest.approx(25.0 / 24.0)


def test_throughputs_compare_as_this_over_other_and_a_missing_round_is_skipped(tmp_path: Path) -> None:
    def graphs(ms: float, tok_s: list[float]) -> dict:
        return {"decode": {"qwen3-0.6b": {"graphs_on": ms, "graphs_off": 5.0}},
                "yardstick": {"graphs_on": [{"output_tok_s": t} for t in tok_s]}}

    _run(tmp_path, "graphs_this_1", "a", graphs(1.0, [20_000.0, 22_000.0, 30_000.0]))
    _run(tmp_path, "graphs_other_1", "b", graphs(1.1, [20_000.0]))
    _run(tmp_path, "graphs_this_2", "a", graphs(1.0, [22_000.0]))  # its other run is missing
    s = guard.summarise(tmp_path)
    tok = s["this_over_other"]["yardstick graphs_on out tok/s (median)"]
    assert tok["rounds"] == 1 and tok["median"] == pytest.approx(22_000 / 20_000)  # the median of three runs
    assert s["this_over_other"]["qwen3-0.6b graphs ms"]["median"] == pytest.approx(1.1)
    assert s["this_over_other"]["qwen3-0.6b eager ms"]["median"] == pytest.approx(1.0)


def test_the_summary_is_written_with_the_runs_commit_and_machine(tmp_path: Path, capsys) -> None:
    _run(tmp_path, "moe_this_1", "new1234", _moe(2.8))
    _run(tmp_path, "moe_other_1", "old1234", _moe(2.9))
    out = tmp_path / "guard.json"
    guard.main([str(tmp_path), "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["benchmark"] == "guard" and data["commit"] == "new1234"
    assert data["hardware"] == {"gpu": "NVIDIA H200"} and data["config"]["other"] == "old1234"
    assert "1.036x" in capsys.readouterr().out


def test_runs_of_two_benchmarks_or_none_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="none"):
        guard.summarise(tmp_path)
    _run(tmp_path, "moe_this_1", "a", _moe(2.8))
    _run(tmp_path, "graphs_other_1", "b", {"decode": {}})
    with pytest.raises(SystemExit, match="one benchmark"):
        guard.summarise(tmp_path)
    with pytest.raises(ValueError, match="not 'tp'"):
        guard.metrics("tp", {})


def test_compare_trees_is_valid_bash() -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_trees.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_http_runs_compare_throughputs_and_the_server_over_offline_ratios(tmp_path: Path) -> None:
    def http(offline: float, plain: float, streamed: float) -> dict:
        return {"offline": {"output_tok_s": offline}, "server_no_stream": {"output_tok_s": plain},
                "server_stream": {"output_tok_s": streamed},
                "server_over_offline": {"no_stream": plain / offline, "stream": streamed / offline}}

    _run(tmp_path, "http_this_1", "new", http(18_000.0, 16_000.0, 15_000.0))
    _run(tmp_path, "http_other_1", "old", http(18_000.0, 12_000.0, 10_000.0))
    g = guard.summarise(tmp_path)["this_over_other"]
    assert g["server stream out tok/s"]["median"] == pytest.approx(1.5)
    assert g["server no stream out tok/s"]["median"] == pytest.approx(16 / 12)
    assert g["offline out tok/s"]["median"] == pytest.approx(1.0)
    assert g["server/offline stream"]["median"] == pytest.approx(1.5)


def test_steps_runs_compare_the_yardstick_its_busy_time_and_the_decode_steps_kernels(tmp_path: Path) -> None:
    def steps(tok_s: float, busy_ms: float, step_us: float, copy_us: float) -> dict:
        return {"output_tok_s": tok_s, "groups": {"all steps": {"busy_ms": busy_ms}},
                "profiled_windows": [{"mode": "mixed", "us_per_step": 17_000.0, "by_kind": {}},
                                     {"mode": "decode", "us_per_step": step_us,
                                      "by_kind": {"copy / index / elementwise": {"us_per_step": copy_us}}}]}

    _run(tmp_path, "steps_this_1", "new", steps(22_000.0, 5_700.0, 6_100.0, 60.0))
    _run(tmp_path, "steps_other_1", "old", steps(20_000.0, 5_800.0, 6_300.0, 144.0))
    g = guard.summarise(tmp_path)["this_over_other"]
    assert g["yardstick out tok/s"]["median"] == pytest.approx(1.1)
    assert g["all steps busy ms"]["median"] == pytest.approx(5_800 / 5_700)
    assert g["profiled decode step ms"]["median"] == pytest.approx(6_300 / 6_100)  # the decode window, not the mixed
    assert g["decode step: copy / index / elementwise ms"]["median"] == pytest.approx(2.4)
