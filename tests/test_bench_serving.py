"""The serving benchmark's client (``python -m benchmarks serving``): its workloads, its
arrivals, its metric definitions on hand-made records, and one short run against a real server."""

from __future__ import annotations

import argparse
import math
import statistics

import pytest

from benchmarks.serving import (
    RequestRecord,
    arrival_times,
    long_and_short_requests,
    random_requests,
    rates,
    run_benchmark,
    summarize,
)
from minisgl.testing import tiny_checkpoint
from minisgl.testing.server import ServerProcess, wait_until_idle


def test_random_lengths_stay_in_the_range_and_follow_the_seed():
    specs = random_requests(400, input_len=100, output_len=40, range_ratio=0.5, vocab=512, seed=3)
    assert {len(s.prompt) for s in specs} <= set(range(50, 101)) and {s.max_tokens for s in specs} <= set(range(20, 41))
    assert min(len(s.prompt) for s in specs) < 55 and max(len(s.prompt) for s in specs) > 95  # the whole range is used
    assert all(0 <= t < 512 for s in specs for t in s.prompt)
    assert specs == random_requests(400, 100, 40, 0.5, 512, seed=3)
    assert specs != random_requests(400, 100, 40, 0.5, 512, seed=4)
    assert {len(s.prompt) for s in random_requests(20, 64, 8, 1.0, 512, seed=0)} == {64}


def test_poisson_arrivals_have_the_asked_rate():
    times = arrival_times(4000, request_rate=20.0, seed=0)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.1)  # exponential: stdev = mean
    assert arrival_times(5, None, 0) == [0.0] * 5


def test_long_prompts_are_spread_among_the_short_ones():
    specs = long_and_short_requests(num_short=30, short_len=8, output_len=4, num_long=2, long_len=100, vocab=512, seed=0)
    tags = [s.tag for s in specs]
    assert tags.count("short") == 30 and tags.count("long") == 2
    assert [i for i, t in enumerate(tags) if t == "long"] == [10, 21]
    assert all(len(s.prompt) == (100 if s.tag == "long" else 8) for s in specs)


def test_rates_parse_inf_as_all_at_once():
    assert rates("4,8.5,inf") == [4.0, 8.5, None]
    with pytest.raises(argparse.ArgumentTypeError, match="must be > 0"):
        rates("0")


def test_metrics_follow_the_bench_serving_definitions():
    """Two requests over a 2-second run: TPOT = (E2E - TTFT) / (tokens - 1); concurrency = sum of
    E2E / duration; throughput from the usage counts; a failed request counted apart."""
    a = RequestRecord("", 0.0, ok=True, ttft_s=0.1, e2e_s=1.0, itl_s=[0.3, 0.3, 0.3], token_events=4,
                      prompt_tokens=10, output_tokens=4, cached_tokens=2)
    b = RequestRecord("", 0.5, ok=True, ttft_s=0.2, e2e_s=1.5, itl_s=[1.3], token_events=2, prompt_tokens=20, output_tokens=2)
    c = RequestRecord("", 0.7, error="HTTP 400: bad")
    m = summarize([a, b, c], duration=2.0)
    assert (m["completed"], m["failed"], m["errors"]) == (2, 1, ["HTTP 400: bad"])
    assert m["tpot_ms"]["mean"] == pytest.approx(((0.9 / 3) + (1.3 / 1)) / 2 * 1000)
    assert m["ttft_ms"]["p50"] == pytest.approx(150.0) and m["e2e_ms"]["mean"] == pytest.approx(1250.0)
    assert m["itl_ms"]["mean"] == pytest.approx((0.9 + 1.3) / 4 * 1000)
    assert m["concurrency"] == pytest.approx(2.5 / 2.0)
    assert (m["output_throughput"], m["input_throughput"], m["request_throughput"]) == (3.0, 15.0, 1.0)
    assert m["cached_tokens"] == 2 and "by_tag" not in m
    one_token = RequestRecord("", 0.0, ok=True, ttft_s=0.1, e2e_s=0.1, token_events=1, output_tokens=1)
    assert math.isnan(summarize([one_token], 1.0)["tpot_ms"]["mean"])  # no TPOT from a single token


def test_metrics_are_also_given_per_tag():
    short = RequestRecord("short", 0.0, ok=True, ttft_s=0.1, e2e_s=0.2, token_events=2, output_tokens=2)
    long = RequestRecord("long", 0.0, ok=True, ttft_s=0.9, e2e_s=1.0, token_events=2, output_tokens=2)
    m = summarize([short, long], 1.0)
    assert m["by_tag"]["short"]["ttft_ms"]["p99"] == pytest.approx(100.0)
    assert m["by_tag"]["long"]["ttft_ms"]["p99"] == pytest.approx(900.0)


def test_a_run_against_the_server_counts_every_token():
    """A short Poisson run against ``python -m minisgl``: every request completes, the output
    token count is what was asked (ignore_eos), one stream event per token, latencies ordered,
    and the server holds no KV page afterwards."""
    specs = random_requests(12, input_len=40, output_len=12, range_ratio=0.5, vocab=512, seed=0)
    with ServerProcess(tiny_checkpoint("qwen3"), "--page-size", "4") as server:
        m = run_benchmark(server.url, specs, request_rate=20.0, max_concurrency=4, seed=0, warmup_requests=1)
        wait_until_idle(server.url)
    assert (m["completed"], m["failed"]) == (12, 0)
    assert m["total_output_tokens"] == sum(s.max_tokens for s in specs)
    assert m["total_input_tokens"] == sum(len(s.prompt) for s in specs)
    assert m["token_events"] == m["total_output_tokens"]  # one stream event per token
    assert m["itl_ms"]["mean"] > 0 and m["ttft_ms"]["p50"] <= m["e2e_ms"]["p50"]
    assert 0 < m["concurrency"] <= 4.0 + 1e-6  # at most 4 in flight
    assert m["request_rate"] == 20.0 and m["max_concurrency"] == 4
