"""``python -m benchmarks pdl --collect``: runs made by hand summarised per mode (CPU; the runs
themselves need a Hopper GPU), and the PDL switch's CPU behaviour."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks import pdl as bench_pdl
from minisgl.layers import decode_kernels


def _write(folder: Path, name: str, benchmark: str, date: str, results: dict, commit: str = "abc1234") -> None:
    payload = {"benchmark": benchmark, "date": date, "commit": commit, "hardware": {"gpu": "NVIDIA H200"},
               "config": {}, "results": results}
    (folder / name).write_text(json.dumps(payload))


def _graphs(ms: float) -> dict:
    return {"decode": {"qwen3-0.6b": {"graphs_on": ms, "graphs_off": 9.0}}}


def test_collect_reads_every_mode_in_date_order_and_summarises(tmp_path: Path) -> None:
    _write(tmp_path, "graphs_0.json", "graphs", "2026-01-01T00:00:02", _graphs(1.2))
    _write(tmp_path, "graphs_early.json", "graphs", "2026-01-01T00:00:01", _graphs(1.0))
    _write(tmp_path, "graphs2_early.json", "graphs", "2026-01-01T00:00:03", _graphs(0.8))
    _write(tmp_path, "graphs_late.json", "graphs", "2026-01-01T00:00:04", _graphs(1.1))
    _write(tmp_path, "moe_0.json", "moe", "2026-01-01T00:00:05", {"decode_bs1": {"ms_per_token": 3.0}})
    _write(tmp_path, "moe_early.json", "moe", "2026-01-01T00:00:06", {"decode_bs1": {"ms_per_token": 2.5}})
    _write(tmp_path, "moe_late.json", "moe", "2026-01-01T00:00:07", {"decode_bs1": {"ms_per_token": 2.4}})
    _write(tmp_path, "unrelated.json", "graphs", "2026-01-01T00:00:00", _graphs(5.0))  # no mode in its name
    runs, names, origin = bench_pdl.collect(tmp_path)
    assert names[:2] == ["graphs_early.json", "graphs_0.json"] and "unrelated.json" not in names
    assert runs["early"]["qwen3-0.6b"] == [1.0, 0.8] and runs["0"]["qwen3-30b-a3b"] == [3.0]
    assert origin == {"commit": "abc1234", "hardware": {"gpu": "NVIDIA H200"}}
    out = tmp_path / "out" / "pdl.json"
    bench_pdl.main(["--collect", str(tmp_path), "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["commit"] == "abc1234" and written["hardware"] == {"gpu": "NVIDIA H200"}
    assert written["results"]["median_ms"]["early"]["qwen3-0.6b"] == pytest.approx(0.9)
    assert written["results"]["speedup_vs_off"]["late"]["qwen3-30b-a3b"] == pytest.approx(3.0 / 2.4)
    assert "MINISGL_COMMIT" not in os.environ or os.environ["MINISGL_COMMIT"] != "abc1234", "restored"


def test_collect_refuses_runs_of_different_commits_or_none(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no <name>_<mode>.json"):
        bench_pdl.collect(tmp_path)
    _write(tmp_path, "graphs_0.json", "graphs", "2026-01-01T00:00:01", _graphs(1.2))
    _write(tmp_path, "graphs_early.json", "graphs", "2026-01-01T00:00:02", _graphs(1.0), commit="def5678")
    with pytest.raises(SystemExit, match="2 different commits or machines"):
        bench_pdl.collect(tmp_path)


def test_pdl_is_off_on_the_cpu_and_modes_are_checked() -> None:
    assert decode_kernels.pdl(torch.zeros(1)) == decode_kernels.PDL_OFF
    with pytest.raises(ValueError, match="PDL mode"):
        decode_kernels.set_pdl(3)
