"""Lesson 12: the acceptance rules. Greedy keeps the target's argmax; sampling keeps its distribution.

Run: pytest lessons/l12

Greedy: the accepted drafts are the longest prefix that equals the target's argmax, and the row
adds one token more (the target's own at the first mismatch, or the bonus). Sampling with the
n-gram proposer (a guess made with certainty): accept draft ``d`` with probability ``p(d)``,
else draw from ``p`` without ``d``. The statistical tests draw many times on a tiny vocabulary
(and, through the whole engine, on a tiny model with top-k 3) and compare the tokens' frequencies
with the target's probabilities by a chi-square test; three wrong rules fail the same test.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine import verify as verify_module
from minisgl.engine.verify import accept_greedy, accept_sampled, greedy_tokens
from minisgl.testing import HFReference, tiny_checkpoint

SPEC_STD = 0.12  # the lesson's test models (see test_l12_engine.py)


def test_greedy_accepts_the_matching_prefix_then_adds_the_targets_token() -> None:
    targets = [5, 6, 7, 8]  # the target's argmax after inputs [L], [L d1], [L d1 d2], [L d1 d2 d3]
    assert (accept_greedy([5, 6, 7], targets), greedy_tokens([5, 6, 7], targets)) == (3, [5, 6, 7, 8])  # + bonus
    assert (accept_greedy([5, 9, 7], targets), greedy_tokens([5, 9, 7], targets)) == (1, [5, 6])  # 7 is not judged
    assert (accept_greedy([4, 6, 7], targets), greedy_tokens([4, 6, 7], targets)) == (0, [5])  # a plain step's token
    assert greedy_tokens([5], [5, 6]) == [5, 6] and greedy_tokens([], [5]) == [5]


# --- sampling: a statistical test on a tiny vocabulary ------------------------------------------


def chi_square_pvalue(counts: Sequence[int], probs: Sequence[float]) -> float:
    """P-value of Pearson's chi-square test that ``counts`` were drawn from ``probs`` (0 if a
    token of probability 0 was drawn). Uses torch's regularised upper incomplete gamma."""
    n = sum(counts)
    if n == 0:
        return float("nan")  # nothing drawn: no evidence either way
    cells = [(c, n * p) for c, p in zip(counts, probs)]
    if any(c > 0 and e == 0 for c, e in cells):
        return 0.0
    stat = sum((c - e) ** 2 / e for c, e in cells if e > 0)
    df = sum(e > 0 for _, e in cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


# Three positions' target distributions over 6 tokens, and two drafts: d1 = 1 (p 0.25 at
# position 0), d2 = 4 (p 0.4 at position 1); then the bonus is drawn from position 2's.
PROBS = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
                      [0.10, 0.10, 0.10, 0.20, 0.40, 0.10],
                      [0.05, 0.05, 0.50, 0.10, 0.10, 0.20]])
DRAFTS = [1, 4]


def rule_pvalues(rule: Callable[[torch.Tensor, Sequence[int], torch.Generator], list[int]],
                 trials: int = 12000) -> dict[str, float]:
    """Run ``rule`` many times; test that the first token follows position 0's distribution,
    the second (after d1 was accepted) position 1's, and the bonus (after both) position 2's."""
    gen = torch.Generator().manual_seed(1234)
    outs = [rule(PROBS, DRAFTS, gen) for _ in range(trials)]
    assert all(1 <= len(o) <= 3 for o in outs)
    first = Counter(o[0] for o in outs)
    second = Counter(o[1] for o in outs if len(o) > 1)
    third = Counter(o[2] for o in outs if len(o) > 2)
    assert all(o[0] == DRAFTS[0] for o in outs if len(o) > 1), "a second token only after an accepted draft"
    return {name: chi_square_pvalue([c[t] for t in range(6)], PROBS[j].tolist())
            for j, (name, c) in enumerate([("first", first), ("second", second), ("bonus", third)])}


def always_accept(probs: torch.Tensor, drafts: Sequence[int], gen: torch.Generator) -> list[int]:
    """Wrong: trusts the draft."""
    return list(drafts) + [int(torch.multinomial(probs[len(drafts)], 1, generator=gen))]


def resample_with_the_draft(probs: torch.Tensor, drafts: Sequence[int], gen: torch.Generator) -> list[int]:
    """Wrong: on rejection draws from p itself, so the rejected draft comes back (too often)."""
    out = []
    for j, d in enumerate(drafts):
        if torch.rand((), generator=gen) < probs[j, d]:
            out.append(d)
            continue
        return out + [int(torch.multinomial(probs[j], 1, generator=gen))]
    return out + [int(torch.multinomial(probs[len(drafts)], 1, generator=gen))]


def accept_only_the_argmax(probs: torch.Tensor, drafts: Sequence[int], gen: torch.Generator) -> list[int]:
    """Wrong: greedy acceptance under sampling (a draft that is not the mode is never kept)."""
    out = []
    for j, d in enumerate(drafts):
        if int(probs[j].argmax()) == d:
            out.append(d)
            continue
        residual = probs[j].clone()
        residual[d] = 0
        return out + [int(torch.multinomial(residual, 1, generator=gen))]
    return out + [int(torch.multinomial(probs[len(drafts)], 1, generator=gen))]


def test_speculative_sampling_keeps_the_target_distribution() -> None:
    pvalues = rule_pvalues(accept_sampled)
    assert all(p > 1e-3 for p in pvalues.values()), pvalues  # (a NaN, a position never reached, fails)


@pytest.mark.parametrize("wrong", [always_accept, resample_with_the_draft, accept_only_the_argmax])
def test_teeth_a_wrong_acceptance_rule_fails_the_statistical_test(wrong) -> None:
    pvalues = rule_pvalues(wrong, trials=4000)
    assert min(p for p in pvalues.values() if p == p) < 1e-6, pvalues  # (NaN: a position never reached)


def test_a_draft_the_target_cannot_sample_is_always_rejected() -> None:
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    gen = torch.Generator().manual_seed(0)
    outs = [accept_sampled(probs, [2], gen) for _ in range(200)]
    assert all(len(o) == 1 and o[0] in (0, 1) for o in outs)


# --- sampling through the engine -----------------------------------------------------------------


class FixedProposer:
    """Proposes the same draft for every request (a test double for the n-gram lookup)."""

    def __init__(self, draft: list[int]) -> None:
        self.draft = draft

    def propose(self, reqs, limits) -> list[list[int]]:
        return [self.draft[:n] for n in limits]

    def release(self, req) -> None:
        pass


@functools.cache
def top3_probs(arch: str, ids: tuple[int, ...]) -> dict[int, float]:
    """The target's next-token distribution after ``ids`` at temperature 1, top-k 3 (HF's logits)."""
    logits = HFReference(tiny_checkpoint(arch, std=SPEC_STD)).logits(list(ids))[-1]
    values, tokens = logits.topk(3)
    return dict(zip(tokens.tolist(), values.softmax(-1).tolist()))


def engine_pvalue(llm: LLM, arch: str, prompt: list[int], n: int) -> tuple[float, int]:
    """Sample ``n`` seeded requests of 3 tokens; chi-square p-value of the first two tokens'
    joint frequencies against the target's; and how many verify steps accepted their draft."""
    first = top3_probs(arch, tuple(prompt))
    joint = {(a, b): pa * pb for a, pa in first.items() for b, pb in top3_probs(arch, (*prompt, a)).items()}
    params = [SamplingParams(temperature=1.0, top_k=3, seed=i, max_tokens=3, ignore_eos=True) for i in range(n)]
    outs = llm.generate([prompt] * n, params, progress=False)
    counts = Counter((o.token_ids[0], o.token_ids[1]) for o in outs)
    cells = sorted(joint)
    assert set(counts) <= set(cells), "a token outside the target's top 3"
    accepted = sum(a for o in outs for a in o.spec_accepted)
    return chi_square_pvalue([counts[c] for c in cells], [joint[c] for c in cells]), accepted


@pytest.mark.parametrize("rule", ["right", "wrong"])
def test_sampling_through_the_engine_follows_the_target(rule: str, monkeypatch) -> None:
    """Each request's second token comes from a verify step whose one draft is the target's
    likeliest second token (after its likeliest first): the pairs of tokens must be as frequent
    as the target makes them. The rule that draws a rejected draft again fails."""
    arch = "qwen3"
    prompt = [37, 201, 14, 88, 450, 9, 301, 77]
    first = top3_probs(arch, tuple(prompt))
    best_first = max(first, key=first.get)
    second = top3_probs(arch, (*prompt, best_first))
    draft = max(second, key=second.get)
    if rule == "wrong":
        monkeypatch.setattr(verify_module, "accept_sampled", resample_with_the_draft)
    llm = LLM(tiny_checkpoint(arch, std=SPEC_STD), speculative="ngram", num_speculative_tokens=1, max_seq_len=64,
              num_pages=512, page_size=4)
    llm.scheduler.loop.proposer = FixedProposer([draft])
    pvalue, accepted = engine_pvalue(llm, arch, prompt, 1200)
    assert accepted > 100, "the draft must be accepted often (else the test shows nothing)"
    if rule == "right":
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6
    kv = llm.scheduler.kv
    assert kv.allocator.num_free + kv.tree.total_pages == kv.num_pages
