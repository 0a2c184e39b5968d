"""Peer clients: SGLang's own serving benchmark, ``sglang.bench_serving``, run against our server.

A server that says it speaks SGLang's and OpenAI's APIs should serve the clients people point at
SGLang unchanged. This runs the published client (``pip install --no-deps sglang``: ``dev.py``
installs the version it pins, ``SGLANG``) in a subprocess against ``python -m minisgl`` serving
the bundled demo model, once per API: ``--backend sglang`` (the native ``/generate``, whose
stream repeats the whole answer so far), ``sglang-oai`` (``/v1/completions``) and
``sglang-oai-chat`` (``/v1/chat/completions``). Each run: 32 prompts of 32 tokens cut from a
ShareGPT-format file made from the demo model's question-answer data (``--dataset-name random``
reads prompts from one), 16 output tokens each with ``ignore_eos`` (the client's default), all
sent at once, and ``--flush-cache`` first (our ``/flush_cache``). It passes when:

* the client says every request succeeded (``completed`` in its ``--output-file`` JSON), and
  counts exactly the tokens asked for (``total_output_tokens`` = 32 × 16);
* the server's ``/metrics`` agree: its generated-token counter grew by exactly those tokens plus
  the client's one warm-up request, every request finished by ``length`` (none aborted or
  failed), the client's flush was served, and no KV page is held afterwards.

**The shims**, all in :data:`RUNNER` (a script written to a temporary folder, never installed):
importing ``sglang.bench_serving`` first runs ``sglang/__init__.py``, which imports SGLang's
whole runtime (torch patches, FlashInfer, Triton); the client needs none of it. The runner
registers ``sglang``, ``sglang.srt`` and ``sglang.srt.utils`` as bare packages (their folders,
their ``__init__`` files not run), so only the client's own modules load, plus
``sglang.srt.utils.network`` (a small module of URL helpers). Two modules are stood in for:
``datasets`` (Hugging Face's; only the MMMU and LongBench datasets load with it, and those need
the hub) and, for sglang 0.5.11 and later, ``sglang.srt.disaggregation.utils`` (one constant,
used only by ``--fake-prefill``; the real module imports the runtime). The client's other
imports are real packages from the dev extras (aiohttp, pybase64, msgspec, orjson).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from minisgl.testing.server import ServerProcess, wait_until_idle

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed (python3 dev.py setup installs it: pip install --no-deps sglang==...)",
                allow_module_level=True)

DEMO_MODEL = Path(__file__).resolve().parents[1] / "minisgl" / "demo" / "model"
QA = Path(__file__).resolve().parent / "demo_training" / "qa.jsonl"  # the demo's questions and answers
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 32, 32, 16
WARMUP_REQUESTS = 1  # bench_serving's default: one request of min(first output length, 32) tokens
BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")

RUNNER = '''"""sglang.bench_serving with the smallest shims that let it import (see tests/test_peer_clients.py)."""
import importlib.util
import json
import runpy
import sys
import traceback
import types

for name in ("sglang", "sglang.srt", "sglang.srt.utils"):  # bare packages: their __init__ imports the runtime
    spec = importlib.util.find_spec(name)
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = package


def _needs_the_hub(*args, **kwargs):
    raise RuntimeError("datasets is a stand-in here: this dataset needs the Hugging Face hub")


sys.modules["datasets"] = types.SimpleNamespace(load_dataset=_needs_the_hub)
# sglang >= 0.5.11: one constant, read only with --fake-prefill (prefill-decode disaggregation).
sys.modules["sglang.srt.disaggregation.utils"] = types.SimpleNamespace(FAKE_BOOTSTRAP_HOST=None)
# One run per line on stdin (its arguments as a JSON list), "DONE <exit code>" after each: the
# test reads the server's counters between runs, and the interpreter and the client's imports
# are paid once for every backend.
for line in sys.stdin:
    sys.argv = ["bench_serving", *json.loads(line)]
    try:
        runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        traceback.print_exc()
        code = 1
    print(f"DONE {code}", flush=True)
'''


@pytest.fixture(scope="module")
def server():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # see tests/test_server_reliability.py
        with ServerProcess(None, start_timeout=300) as s:  # no --model: the demo model
            yield s


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The runner, and the demo's questions and answers as ShareGPT conversations."""
    path = tmp_path_factory.mktemp("peer_clients")
    (path / "run_bench_serving.py").write_text(RUNNER)
    rows = [json.loads(line) for line in QA.read_text().splitlines() if line.strip()]
    conversations = [{"conversations": [{"from": "human", "value": r["question"]}, {"from": "gpt", "value": r["answer"]}]}
                     for r in rows]
    (path / "sharegpt.json").write_text(json.dumps(conversations))
    return path


def counters(url: str) -> dict[str, float]:
    m = wait_until_idle(url)
    return {"generated": m["minisgl_generation_tokens_total"], "flushes": m["minisgl_cache_flushes_total"],
            **{reason: m.get(f'minisgl_requests_total{{finish_reason="{reason}"}}', 0.0)
               for reason in ("length", "stop", "abort", "error")}}


@pytest.fixture(scope="module")
def runs(server, workdir: Path) -> dict[str, dict]:
    """Every backend's run, one after another in one runner process: its exit code, output, the
    server's counters before and after it, and its ``--output-file``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    runner = subprocess.Popen([sys.executable, str(workdir / "run_bench_serving.py")], cwd=workdir, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    results = {}
    watchdog = threading.Timer(600, runner.kill)  # a hung client fails the runs instead of the session
    watchdog.start()
    try:
        for backend in BACKENDS:
            out = workdir / f"{backend}.jsonl"
            argv = ["--backend", backend, "--base-url", server.url, "--model", str(DEMO_MODEL),
                    "--served-model-name", "demo", "--tokenizer", str(DEMO_MODEL), "--dataset-name", "random",
                    "--dataset-path", str(workdir / "sharegpt.json"), "--num-prompts", str(NUM_PROMPTS),
                    "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
                    "--random-range-ratio", "1", "--flush-cache", "--output-file", str(out), "--disable-tqdm"]
            before = counters(server.url)
            runner.stdin.write(json.dumps(argv) + "\n")
            runner.stdin.flush()
            lines = []
            for line in runner.stdout:  # until the run's DONE line (or the runner's end)
                if line.startswith("DONE "):
                    break
                lines.append(line)
            code = int(line.split()[1]) if line.startswith("DONE ") else runner.wait(10)
            results[backend] = {"code": code, "output": "".join(lines), "before": before,
                                "after": counters(server.url), "out": out}
    finally:
        runner.stdin.close()
        runner.wait(60)
        watchdog.cancel()
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_bench_serving_counts_every_token(runs: dict, backend: str) -> None:
    run = runs[backend]
    report, before, after, out = run["output"], run["before"], run["after"], run["out"]
    assert run["code"] == 0, report[-4000:]
    print(f"sglang {importlib.metadata.version('sglang')}, --backend {backend}:\n"
          + "\n".join(line for line in report.splitlines() if ":" in line and "Namespace" not in line))

    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == NUM_PROMPTS, report[-4000:]
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, result
    asked = (NUM_PROMPTS + WARMUP_REQUESTS) * OUTPUT_LEN
    assert after["generated"] - before["generated"] == asked, (before, after)
    assert after["length"] - before["length"] == NUM_PROMPTS + WARMUP_REQUESTS, (before, after)
    assert [after[r] - before[r] for r in ("stop", "abort", "error")] == [0, 0, 0], (before, after)
    assert after["flushes"] - before["flushes"] == 1, "--flush-cache reached /flush_cache"
