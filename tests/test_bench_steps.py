"""``python -m benchmarks steps``: every launched step recorded once, the groups add up, and
each step's lower bound follows from the model's bytes and FLOPs."""

from __future__ import annotations

import json

import pytest

from benchmarks.offline import make_workload
from benchmarks.steps import Hardware, ModelCost, Step, Window, main, summarise


def test_steps_json_on_cpu(tmp_path) -> None:
    out = tmp_path / "steps.json"
    main(["--device", "cpu", "--shape", "tiny", "--num-requests", "6", "--min-len", "4", "--max-len", "12",
          "--out", str(out)])
    results = json.loads(out.read_text())["results"]
    _, out_lens = make_workload(6, 4, 12, vocab=512, seed=0)
    assert results["output_tokens"] == sum(out_lens)
    steps = [Step(**s) for s in results["steps"]]
    # Every sampled token came from exactly one recorded step; every step has a time and a bound.
    assert sum(s.sampled for s in steps) == sum(out_lens)
    assert all(s.busy_ms > 0 and s.bound_ms > 0 and not s.profiled for s in steps)
    assert {s.mode for s in steps} >= {"prefill", "decode"}
    groups = results["groups"]
    total = groups.pop("all steps")
    for key in ("steps", "tokens", "sampled", "busy_ms", "bound_ms"):
        assert total[key] == pytest.approx(sum(g[key] for g in groups.values()))
    assert total["steps"] == len(steps)
    assert total["busy_over_bound"] == pytest.approx(total["busy_ms"] / total["bound_ms"])
    assert results["profiled_windows"][0]["profiled_steps"] == []  # nothing is profiled on the CPU


def test_step_bound_counts_bytes_and_flops() -> None:
    cost = ModelCost(weight_bytes=1000, body_params=10, lm_head_params=100, kv_bytes_per_token=4,
                     attention_flops_per_pair=2)
    # Two rows: a decode row (1 new token, context 5 after it) and a 3-token prefill (context 3).
    step = Step("mixed", rows=2, tokens=4, sampled=2, context=4)
    memory_bound = Hardware(bandwidth=1.0, flops=1e12)
    moved = 1000 + 4 * (4 + 4)  # weights once, the KV read (context) and written (new tokens)
    assert cost.bound_ms(step, [1, 3], [5, 3], memory_bound) == pytest.approx(1e3 * moved)
    compute_bound = Hardware(bandwidth=1e12, flops=1.0)
    pairs = 1 * 4 + 1 + (0 + 6)  # decode: 4 older tokens + itself; prefill: 1 + 2 + 3 causal pairs
    flops = 2 * (10 * 4 + 100 * 2) + 2 * pairs
    assert cost.bound_ms(step, [1, 3], [5, 3], compute_bound) == pytest.approx(1e3 * flops)


def test_summary_groups_decode_steps_by_rows_and_leaves_profiled_steps_out() -> None:
    steps = [Step("decode", rows, rows, rows, 10 * rows, busy_ms=1.0, bound_ms=0.5) for rows in (1, 16, 17, 200)]
    steps.append(Step("decode", 200, 200, 200, 2000, busy_ms=9.0, bound_ms=1.0, profiled=True))
    groups = summarise(steps)
    assert groups["decode 1-16 rows"]["steps"] == 2
    assert groups["decode 17-64 rows"]["steps"] == 1
    assert groups["decode 193-256 rows"]["busy_ms"] == 1.0  # the profiled step is not counted
    assert groups["all steps"]["busy_over_bound"] == pytest.approx(2.0)


def test_profile_window_parsing() -> None:
    assert Window.parse("decode:50:10") == Window("decode", 50, 10)
    assert Window.parse("decode<=128:5:10") == Window("decode", 5, 10, max_rows=128)
    with pytest.raises(Exception, match="prefill, mixed or decode"):
        Window.parse("graphs:1:2")
    with pytest.raises(Exception, match="only decode windows"):
        Window.parse("mixed<=8:1:2")


def test_which_steps_a_window_counts() -> None:
    """A plain decode window counts the steps at the largest batch seen; one with a row limit,
    the steps of at most that many rows (a shrinking batch gets there late in the run)."""
    def decode(rows: int) -> Step:
        return Step("decode", rows, rows, rows, 10 * rows)

    full, capped, mixed = Window("decode", 0, 1), Window("decode", 0, 1, max_rows=128), Window("mixed", 0, 1)
    assert full.counts(decode(256), 256) and not full.counts(decode(200), 256)
    assert not capped.counts(decode(256), 256) and capped.counts(decode(128), 256) and capped.counts(decode(3), 256)
    assert not mixed.counts(decode(256), 256) and not capped.counts(Step("mixed", 8, 300, 8, 900), 256)


def test_profiled_kernels_are_grouped_by_kind_per_step() -> None:
    """The grouping that `bench steps` (with the costliest names) and `bench graphs` share, on
    a made-up profile: two steps of two matmuls, one norm and one unknown kernel."""
    import torch

    from benchmarks.graphs import kernels_by_kind

    class Event:
        def __init__(self, name: str, us: float, device=torch.autograd.DeviceType.CUDA) -> None:
            self.name, self.device_time_total, self.device_type = name, us, device

    class Profile:
        def events(self):
            return [Event("nvjet_gemm_a", 10), Event("nvjet_gemm_b", 6), Event("FusedAddRMSNormKernel", 2),
                    Event("weird", 1), Event("cpu op", 99, torch.autograd.DeviceType.CPU)]

    plain = kernels_by_kind(Profile(), steps=2)
    assert plain["kernels_per_step"] == 2.0
    assert list(plain["by_kind"]) == ["matmul (GEMM/GEMV)", "RMSNorm", "other"], "costliest kind first"
    assert plain["by_kind"]["matmul (GEMM/GEMV)"] == {"kernels_per_step": 1.0, "us_per_step": 8.0}
    named = kernels_by_kind(Profile(), steps=2, top_names=1)["by_kind"]["matmul (GEMM/GEMV)"]
    assert named["top_kernels_us_per_step"] == {"nvjet_gemm_a": 5.0}


def test_kernel_names_seen_in_a_decode_step_get_their_kind() -> None:
    """Names from the H200's profiles: the bf16 logits' copy into the graph's output is a
    ``memcpy128`` kernel (a float32 conversion was an elementwise copy), the argmax a reduction."""
    from benchmarks.graphs import kernel_kind

    assert kernel_kind("memcpy128") == "copy / index / elementwise"
    assert kernel_kind("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda") == \
        "copy / index / elementwise"
    assert kernel_kind("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
                       "at::native::ArgMaxOps<float>") == "sampling (argmax)"
    assert kernel_kind("_qk_norm_rope_kernel") == "q/k norms + RoPE (fused)"


def test_device_timeline_splits_launch_gaps_from_host_waits() -> None:
    """`bench graphs --timeline-processes`: two made-up steps of three kernels (µs). Gaps under
    HOST_WAIT_GAP_US are the device starting the next kernel; the 20 µs one is a wait for the
    host; a kernel that overlaps another leaves no gap, and the next gap starts where the
    device's last busy kernel ended."""
    from benchmarks.graphs import HOST_WAIT_GAP_US, device_timeline

    assert HOST_WAIT_GAP_US == 4.0
    kernels = [(140.0, 150.0), (0.0, 10.0), (11.0, 20.0), (20.5, 100.0),  # given in any order
               (100.0, 120.0), (110.0, 115.0)]  # inside the one before: busy until 120
    t = device_timeline(kernels, steps=2)
    assert t["kernels_per_step"] == 3.0
    assert t["kernel_us_per_step"] == pytest.approx((10 + 9 + 79.5 + 20 + 5 + 10) / 2)
    assert t["launch_gap_us_per_step"] == pytest.approx((1 + 0.5) / 2)  # gaps 1, 0.5, 0, 0
    assert t["host_wait_us_per_step"] == pytest.approx(20 / 2)  # 140 - 120
    assert t["host_waits_per_step"] == 0.5
