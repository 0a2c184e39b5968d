"""The offline benchmark: a single-request run, its JSON, and HF's left-padded batches."""

from __future__ import annotations

import json
import random

import pytest
import torch

from benchmarks.offline import hf_generate_batch, main, make_workload
from minisgl.testing import HFReference, distinct_fraction, tiny_checkpoint


@pytest.mark.parametrize(
    "n, extra",
    [
        (1, []),  # one request: the warm-up used to ask for two prompts and crash
        (5, ["--hf-requests", "2", "--hf-batch-size", "2"]),  # three static batches, the last one short
    ],
)
def test_offline_json(tmp_path, n: int, extra: list[str]) -> None:
    out = tmp_path / "offline.json"
    main(["--shape", "tiny", "--num-requests", str(n), "--min-len", "3", "--max-len", "9",
          "--hf-requests", "1", *extra, "--out", str(out)])
    data = json.loads(out.read_text())
    results, config = data["results"], data["config"]
    _, out_lens = make_workload(n, 3, 9, vocab=512, seed=0)  # lengths depend on the seed only
    assert config["num_requests"] == n

    engine = results["engine"]
    assert engine["requests"] == n and engine["output_tokens"] == sum(out_lens)

    hf = results["hf"]
    k = config["hf_requests"]
    assert hf["requests"] == k == min(n, 2 if extra else 1)
    assert hf["mode"] == "one request at a time"
    assert hf["output_tokens"] == sum(out_lens[:k])

    batched = results["hf_batched"]
    bs = 2 if extra else 64
    assert batched["requests"] == config["hf_batched_requests"] == n  # default: the whole workload
    assert batched["batch_size"] == config["hf_batch_size"] == bs
    assert batched["mode"].startswith(f"static batches of {bs}, left-padded")
    assert batched["output_tokens"] == sum(out_lens)
    batches = [out_lens[i:i + bs] for i in range(0, n, bs)]
    assert batched["generated_tokens"] == sum(len(b) * max(b) for b in batches) >= batched["output_tokens"]

    for run in (engine, hf, batched):
        assert run["time_s"] > 0
        assert run["output_tok_s"] == pytest.approx(run["output_tokens"] / run["time_s"])
    assert results["speedup_vs_hf"] == pytest.approx(engine["output_tok_s"] / hf["output_tok_s"])
    assert results["speedup_vs_hf_batched"] == pytest.approx(engine["output_tok_s"] / batched["output_tok_s"])


def test_left_padded_batch_matches_one_at_a_time() -> None:
    """Batched HF greedy (left padding + attention mask) gives HF's batch-of-one tokens, float32 CPU."""
    ref = HFReference(tiny_checkpoint("qwen3"), dtype=torch.float32, device="cpu")
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(m)] for m in (3, 17, 9, 30)]
    out_lens = [12, 5, 16, 9]

    batched = hf_generate_batch(ref.model, prompts, out_lens, "cpu")
    alone = [ref.greedy(p, n) for p, n in zip(prompts, out_lens)]
    assert [len(t) for t in batched] == out_lens
    assert all(distinct_fraction(t) > 0.3 for t in alone), "a degenerate model would prove nothing"
    assert batched == alone

    # The check has teeth: attending to the pad tokens (no mask) changes the shorter prompts' tokens.
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    cfg = GenerationConfig(do_sample=False, max_new_tokens=max(out_lens), eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        unmasked = ref.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    unmasked = [row[width:width + n] for row, n in zip(unmasked.tolist(), out_lens)]
    assert unmasked[0] != alone[0]
