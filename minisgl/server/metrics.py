"""Lesson 10: ``/metrics`` in Prometheus' text format (``prometheus-client``).

Request-side numbers (counts, tokens, time to first token, inter-token latency, end-to-end
latency) are measured in the API process, where the client's clock runs. Engine-side numbers
(running and waiting requests, KV pages, prefix-cache hits) come from the scheduler's
:class:`~minisgl.server.messages.Stats` after each step.

KV pages are reported three ways, which add up to ``minisgl_kv_pages_total``: ``free``,
``cached`` (held only by the radix cache, evictable) and ``used`` (held by requests). With no
request running, ``used`` must be 0: anything else is a leak.

With speculative decoding (lesson 12), ``minisgl_spec_accepted_tokens`` is a histogram of verify
rows (one request's step with draft tokens) by how many drafts the target accepted, bucket
``le="a"`` counting the rows that accepted at most ``a``; its ``_sum`` is the accepted tokens,
its ``_count`` the verify rows. The scheduler keeps the counts; this page shows its latest.
"""

from __future__ import annotations

__lesson__ = 10

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from minisgl.server.messages import Stats

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("minisgl_requests", "Finished requests, by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("minisgl_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter("minisgl_cached_prompt_tokens", "Prompt tokens served from the prefix cache", registry=r)
        self.generation_tokens = Counter("minisgl_generation_tokens", "Generated tokens", registry=r)
        self.cache_flushes = Counter("minisgl_cache_flushes", "/flush_cache calls that succeeded", registry=r)
        self.ttft = Histogram("minisgl_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("minisgl_inter_token_latency_seconds", "Time between two tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("minisgl_e2e_request_latency_seconds", "Request latency, arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge("minisgl_num_running_requests", "Requests in the running batch", registry=r)
        self.waiting = Gauge("minisgl_num_waiting_requests", "Requests queued for admission", registry=r)
        self.pages_total = Gauge("minisgl_kv_pages_total", "KV pages in the pool", registry=r)
        self.pages_free = Gauge("minisgl_kv_pages_free", "KV pages in the free list", registry=r)
        self.pages_cached = Gauge("minisgl_kv_pages_cached", "KV pages held only by the prefix cache", registry=r)
        self.pages_used = Gauge("minisgl_kv_pages_used", "KV pages held by requests", registry=r)
        self.kv_usage = Gauge("minisgl_kv_usage", "Fraction of KV pages held by requests", registry=r)
        self.hit_rate = Gauge("minisgl_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens",
                              registry=r)
        self.acceptance = AcceptanceHistogram()
        r.register(self.acceptance)
        self._last_token: dict[str, float] = {}

    def on_token(self, rid: str, start: float) -> None:
        now = time.perf_counter()
        last = self._last_token.get(rid)
        if last is None:
            self.ttft.observe(now - start)
        else:
            self.itl.observe(now - last)
        self._last_token[rid] = now

    def on_finish(self, rid: str, reason: str | None, prompt_tokens: int, completion_tokens: int,
                  cached_tokens: int, start: float) -> None:
        self._last_token.pop(rid, None)
        self.requests.labels(finish_reason=reason or "error").inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.e2e.observe(time.perf_counter() - start)

    def set_engine_stats(self, s: Stats) -> None:
        used = s.num_pages - s.free_pages - s.cached_pages
        self.running.set(s.running)
        self.waiting.set(s.waiting)
        self.pages_total.set(s.num_pages)
        self.pages_free.set(s.free_pages)
        self.pages_cached.set(s.cached_pages)
        self.pages_used.set(used)
        self.kv_usage.set(used / s.num_pages if s.num_pages else 0.0)
        self.hit_rate.set(s.prefix_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else 0.0)
        self.acceptance.counts = list(s.spec_accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class AcceptanceHistogram:
    """``minisgl_spec_accepted_tokens``: a Prometheus histogram drawn from counts the scheduler
    keeps (``counts[a]``: verify rows that accepted ``a`` draft tokens), so the page always shows
    the engine's own totals (a custom collector: prometheus-client's ``Histogram`` only counts
    what is observed in this process)."""

    name = "minisgl_spec_accepted_tokens"

    def __init__(self) -> None:
        self.counts: list[int] = []

    def collect(self):
        cumulative, buckets = 0, []
        for accepted, rows in enumerate(self.counts):
            cumulative += rows
            buckets.append((str(accepted), cumulative))
        buckets.append(("+Inf", cumulative))
        total = sum(a * rows for a, rows in enumerate(self.counts))
        yield HistogramMetricFamily(self.name, "Speculative decoding: draft tokens accepted per verify row",
                                    buckets=buckets, sum_value=total)

    def describe(self):
        return [HistogramMetricFamily(self.name, "Speculative decoding: draft tokens accepted per verify row")]


def _label_value(value: str) -> str:
    """A label value escaped as the text format writes it (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_metrics(text: str) -> dict[str, float]:
    """A ``/metrics`` page, read by prometheus-client's own parser, as a dict of every sample:
    ``name{label="value",...}`` (as the page writes it; just ``name`` without labels) to its
    value. How the tests and the notebook read it."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{_label_value(value)}"' for key, value in sample.labels.items())
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return values
