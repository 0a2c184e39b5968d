"""Lesson 12: a seeded request is reproducible under speculation.

Run: pytest lessons/l12

The sampling rule draws (the acceptance test, the replacement token, the bonus) from the
request's own generator, never from torch's global one: the same seed gives the same tokens
whatever else the process drew in between. (They differ from the same seed *without*
speculation: the draws are used differently.)
"""

from __future__ import annotations

import torch

from minisgl import LLM, SamplingParams
from minisgl.engine.verify import accept_sampled
from minisgl.testing import tiny_checkpoint

SPEC_STD = 0.12  # the lesson's test models (see test_l12_engine.py)
PROBS = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
                      [0.10, 0.10, 0.10, 0.20, 0.40, 0.10],
                      [0.05, 0.05, 0.50, 0.10, 0.10, 0.20]])
DRAFTS = [1, 4]


def test_accept_sampled_draws_only_from_the_given_generator() -> None:
    """The same seed twice, torch's global generator reseeded in between: the same rows."""
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(99)
        runs.append([accept_sampled(PROBS, DRAFTS, gen) for _ in range(200)])
    assert runs[0] == runs[1], "a seeded row's tokens changed with torch's global generator"
    assert len({tuple(r) for r in runs[0]}) > 5, "the rows must vary from draw to draw (else the test shows nothing)"


def test_seeded_requests_are_reproducible_through_the_engine() -> None:
    """Seeded sampling requests on prompts that repeat themselves (so the n-gram proposer
    drafts): run twice, with torch's global generator reseeded in between, the same tokens."""
    prompts = [[11, 12, 13, 14] * 4, [40, 41, 42] * 5, [300, 7, 300, 8] * 3]
    params = [SamplingParams(temperature=1.0, top_k=3, seed=100 + i, max_tokens=16, ignore_eos=True)
              for i in range(len(prompts))]
    llm = LLM(tiny_checkpoint("qwen3", std=SPEC_STD), speculative="ngram", num_speculative_tokens=3, max_seq_len=64,
              num_pages=128, page_size=4)
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        runs.append(llm.generate(prompts, params, progress=False))
    assert sum(d for o in runs[0] for d in o.spec_drafted) > 0, "no step drafted (the test lost its teeth)"
    for a, b in zip(*runs):
        assert a.token_ids == b.token_ids, "the same seed gave different tokens"
