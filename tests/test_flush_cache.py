"""``/flush_cache``: SGLang's endpoint for emptying the radix cache, which its benchmark clients
call before a run (``bench_serving --flush-cache``).

It crosses all three processes (API server → tokenizer worker → scheduler, and a
:class:`~minisgl.server.messages.FlushResult` back) and, with ``--tp-size 2``, every rank. The
tests check, through ``/metrics`` and ``usage.prompt_tokens_details.cached_tokens``:

* **idle**: a repeated prompt hits the cache; after a flush (POST or GET) the cache holds no
  page, every page is free, and the same prompt again hits nothing and answers the same text;
* **busy**: while a request streams, a flush is refused (400, an OpenAI error body) and changes
  nothing; ``?timeout=S`` waits for the request to end and then flushes; the request itself
  completes with exactly the tokens it gets alone;
* **tensor parallel**: both ranks flush (the ranks' replies are compared by ``RankClient``);
* ``--no-prefix-cache``: a success that does nothing;
* a bad ``timeout`` gets a 400 naming it.

Every server runs with ``OMP_NUM_THREADS=1`` (see ``tests/test_server_reliability.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import httpx
import pytest

from minisgl.testing import tiny_checkpoint
from minisgl.testing.server import ServerProcess, wait_until_idle
from tests.tools.load import error_body_problem, greedy_ids

START_S = 300  # servers started together on a busy 2-core machine queue for the cores
# Long enough for several 4-token pages; each test uses its own prompt, so no test sees
# another's cache entries.
PROMPT = ("Paged memory splits the cache into blocks, and a block table maps each request to its "
          "blocks, like virtual memory in an operating system. A radix tree remembers shared prefixes")


@pytest.fixture(scope="module")
def servers():
    """The three servers, started at once (see ``tests/test_server_reliability.py``)."""
    tiny = tiny_checkpoint("qwen3")
    wanted = {
        "main": ServerProcess(tiny, "--page-size", "4", start_timeout=START_S),
        "tp": ServerProcess(tiny, "--tp-size", "2", "--page-size", "4", start_timeout=START_S),
        "no_cache": ServerProcess(tiny, "--no-prefix-cache", start_timeout=START_S),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            started = {name: pool.submit(s.__enter__) for name, s in wanted.items()}
    yield {name: future.result for name, future in started.items()}
    for name, future in started.items():
        if future.exception() is None and wanted[name].proc.poll() is None:
            wanted[name].stop()


def complete(url: str, prompt: str, max_tokens: int = 4) -> dict:
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": served_model(url), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()


def served_model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def cached_tokens(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def pages(url: str) -> dict[str, int]:
    """The KV pool once idle, and how many flushes succeeded so far."""
    m = wait_until_idle(url)
    return {**{k: int(m[f"minisgl_kv_pages_{k}"]) for k in ("total", "free", "cached", "used")},
            "flushes": int(m["minisgl_cache_flushes_total"])}


def check_flush_empties_the_cache(url: str, prompt: str, method: str = "POST") -> str:
    """The idle case on one server; returns the flush's answer."""
    first = complete(url, prompt)
    again = complete(url, prompt)
    assert cached_tokens(first) == 0 and cached_tokens(again) > 0, (first["usage"], again["usage"])
    before = pages(url)
    assert before["cached"] > 0 and before["free"] + before["cached"] == before["total"], before

    r = httpx.request(method, f"{url}/flush_cache", timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain") and r.text.startswith("Cache flushed."), r.text
    assert f"{before['cached']} page(s) freed" in r.text, (before, r.text)
    after = pages(url)
    assert after == {"total": before["total"], "free": before["total"], "cached": 0, "used": 0,
                     "flushes": before["flushes"] + 1}, after

    fresh = complete(url, prompt)
    assert cached_tokens(fresh) == 0, fresh["usage"]
    assert fresh["choices"][0]["text"] == first["choices"][0]["text"]
    return r.text


def test_idle_flush_empties_the_radix_cache(servers) -> None:
    check_flush_empties_the_cache(servers["main"]().url, PROMPT)


def test_get_flushes_too(servers) -> None:
    """SGLang's server answers GET as well as POST (its older clients send GET)."""
    check_flush_empties_the_cache(servers["main"]().url, "GET: " + PROMPT, method="GET")


def test_every_tensor_parallel_rank_flushes(servers) -> None:
    check_flush_empties_the_cache(servers["tp"]().url, "TP: " + PROMPT)


def test_without_a_prefix_cache_a_flush_does_nothing(servers) -> None:
    url = servers["no_cache"]().url
    complete(url, PROMPT)
    before = pages(url)
    r = httpx.post(f"{url}/flush_cache", timeout=30)
    assert r.status_code == 200 and "nothing to flush" in r.text, r.text
    assert pages(url) == {**before, "flushes": before["flushes"] + 1}
    assert before["free"] == before["total"] and before["cached"] == 0, before


async def _flush_while_running(url: str) -> None:
    prompt, n = "Busy: " + PROMPT, 400
    flushes = pages(url)["flushes"]
    async with httpx.AsyncClient(timeout=120) as client:
        alone = await greedy_ids(client, url, prompt, n)  # the reference (and the prompt cached)
        body = {"text": prompt, "stream": True, "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                                     "ignore_eos": True}}
        events: list[dict] = []
        async with client.stream("POST", f"{url}/generate", json=body) as stream:
            lines = stream.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    break
            # The request runs: refused at once.
            refused = await client.post(f"{url}/flush_cache")
            assert refused.status_code == 400, refused.text
            assert error_body_problem(refused.json()) is None, refused.text
            assert "1 request(s) running" in refused.json()["error"]["message"], refused.text
            # With a timeout, the flush waits for the request to end, then flushes.
            waited = asyncio.ensure_future(client.post(f"{url}/flush_cache", params={"timeout": 60}))
            async for line in lines:
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
            flushed = await waited
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed."), flushed.text
    last = events[-1]
    assert last["output_ids"] == alone and last["meta_info"]["finish_reason"] == "length", last["meta_info"]
    assert last["meta_info"]["completion_tokens"] == n and last["meta_info"]["cached_tokens"] > 0
    after = pages(url)
    assert after["cached"] == 0 and after["free"] == after["total"], after
    assert after["flushes"] == flushes + 1, "the refused flush is not counted, the one that waited is"


def test_flush_while_a_request_runs_is_refused_and_the_request_completes(servers) -> None:
    asyncio.run(_flush_while_running(servers["main"]().url))


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "soon"])
def test_a_bad_timeout_is_refused(servers, timeout: str) -> None:
    r = httpx.post(f"{servers['main']().url}/flush_cache", params={"timeout": timeout}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "timeout", r.text
