"""The server against its own OpenAPI document, driven by schemathesis.

``/openapi.json`` publishes the request models of ``minisgl/server/protocol.py`` (the one
description of what each endpoint accepts). schemathesis reads it and generates requests for
every operation: bodies that fit the schema (positive) and bodies that break it in one place
(negative), about 1,100 in all (80 per operation and mode: the suite's time; >= 1,000 asked).
Whatever comes, the server must answer without a 5xx, every
error must be an OpenAI error body, and afterwards the engine must be idle with no KV page
held and answer the probe prompt with the same greedy tokens as before.

The server runs with a short context (``--max-seq-len 64``) so that a generated ``n=64`` with
the largest ``max_tokens`` still finishes in seconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from minisgl.testing import tiny_checkpoint  # noqa: E402
from minisgl.testing.server import ServerProcess  # noqa: E402
from tests.tools.load import PROBE_PROMPT, error_body_problem, greedy_ids, settle  # noqa: E402

EXAMPLES_PER_OPERATION = 80  # 6 POSTs x 2 modes + /v1/models/{model_id}: >= 1,000 cases
SEEN: Counter[str] = Counter()  # status classes over the whole run, for the last test
BEFORE: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(tiny_checkpoint("qwen3"), "--max-seq-len", "64") as s:
        BEFORE["probe"] = asyncio.run(_probe(s.url))
        yield s


async def _probe(url: str) -> list[int]:
    async with httpx.AsyncClient() as client:
        return await greedy_ids(client, url, PROBE_PROMPT, 8)


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def _runs() -> list[tuple[str, schemathesis.GenerationMode]]:
    """(operation, mode) pairs, known without a server: every operation with bodies that fit
    the schema; those that take a body also with bodies that break it (a GET without parameters
    has nothing to break)."""
    from minisgl.server.protocol import REQUEST_MODELS

    posts = [f"POST {path}" for path in (*REQUEST_MODELS, "/flush_cache")]  # flush: its ?timeout
    gets = [f"GET {path}" for path in ("/v1/models", "/v1/models/{model_id}", "/health", "/metrics", "/flush_cache")]
    positive, negative = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
    return [(label, positive) for label in posts + gets] + [(label, negative) for label in posts]


@pytest.mark.parametrize("label, mode", _runs(), ids=[f"{label}-{mode.value}" for label, mode in _runs()])
def test_no_generated_request_gets_a_5xx_or_a_malformed_error(api_schema, server, label: str, mode) -> None:
    """schemathesis's cases for one operation in one mode (hypothesis drives them, shrinking a
    failure to its smallest body)."""
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in /openapi.json"

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)
    def check(case) -> None:
        response = case.call(base_url=server.url, timeout=60)
        SEEN[f"{response.status_code}"] += 1
        assert response.status_code < 500, f"{label} {case.body!r:.500}: {response.text[:500]}"
        if response.status_code >= 400:
            problem = error_body_problem(response.json())
            assert problem is None, f"{label} {case.body!r:.300}: {problem}"

    check()


def test_after_the_run_the_engine_is_as_it_was(server) -> None:
    """Runs after the generated cases (pytest keeps a file's order): enough of them, of both
    kinds, and the engine idle, no page leaked, the same greedy tokens."""
    print(f"schemathesis: {sum(SEEN.values())} requests, by status {dict(sorted(SEEN.items()))}")
    assert sum(SEEN.values()) >= 1000, SEEN
    assert SEEN["200"] >= 100 and sum(n for k, n in SEEN.items() if k.startswith("4")) >= 100, SEEN
    pool = asyncio.run(settle(server.url))
    assert pool.idle and pool.leaked == 0, pool
    assert asyncio.run(_probe(server.url)) == BEFORE["probe"]
