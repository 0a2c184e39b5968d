"""``python -m benchmarks moe``'s flags on the CPU: which parts of the results each combination
writes. The parts themselves need a CUDA GPU; here each is replaced by a stand-in that records
that it ran, so the test checks only how ``main`` puts them together (the tile choice needs the
layer sweep and the tile sweep; ``--latency`` runs with or without the layer sweep)."""

from __future__ import annotations

import pytest

from benchmarks import moe

PARTS = ("gemv_tile_sweep", "router_sweep", "layer_sweep", "kernel_breakdown", "choose_gemv", "latency_bs1",
         "decode_run")


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Every GPU part of ``benchmarks.moe`` stubbed; ``written["results"]`` is what ``main`` wrote."""
    out: dict = {}
    for name in PARTS:
        monkeypatch.setattr(moe, name, lambda *args, name=name: f"{name} ran")
    monkeypatch.setattr(moe, "copy_bandwidth", lambda device: 3e12)
    monkeypatch.setattr(moe, "use_best_tiles", lambda sweep: None)
    monkeypatch.setattr(moe.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(moe, "write_result", lambda path, name, config, results: out.update(results=results) or path)
    return out


@pytest.mark.parametrize("flags, parts", [
    ([], {"layer", "kernels_bs1"}),
    (["--gemv-tiles"], {"gemv_tiles_bs1", "router_tiles_bs1", "layer", "kernels_bs1", "gemv_choice"}),
    (["--latency"], {"layer", "kernels_bs1", "latency_bs1"}),
    (["--gemv-tiles", "--latency"],
     {"gemv_tiles_bs1", "router_tiles_bs1", "layer", "kernels_bs1", "gemv_choice", "latency_bs1"}),
    (["--skip-layer", "--latency", "--decode"], {"latency_bs1", "decode_bs1"}),
    (["--skip-layer", "--gemv-tiles"], set()),
])
def test_each_flag_writes_its_parts(written: dict, flags: list[str], parts: set[str]) -> None:
    moe.main(["--device", "cuda", "--out", "unused.json", *flags])
    results = written["results"]
    assert set(results) - {"copy_bandwidth_bytes_s"} == parts
    if "gemv_choice" in parts:
        assert results["gemv_choice"] == "choose_gemv ran"
