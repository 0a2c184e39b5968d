"""The sampler and `SamplingParams` without a model: filtering rules, statistics, validation.

Run: pytest tests/test_sampler.py
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Req
from minisgl.engine.sampler import Sampler, filter_logits
from minisgl.sampling_params import SamplingParams

NEG_INF = float("-inf")


def kept(row: torch.Tensor) -> list[int]:
    """Indices a filtered row still allows."""
    return torch.isfinite(row).nonzero().flatten().tolist()


def filt(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    logits = logits.reshape(-1, logits.shape[-1]).float()
    b = logits.shape[0]
    k = torch.tensor(top_k if isinstance(top_k, list) else [top_k] * b, dtype=torch.int64)
    p = torch.tensor(top_p if isinstance(top_p, list) else [top_p] * b, dtype=torch.float32)
    return filter_logits(logits, k, p)


def make_req(params: SamplingParams, seed: int | None = None) -> Req:
    req = Req(0, [1], params, frozenset())
    if seed is not None:
        req.generator = torch.Generator().manual_seed(seed)
    return req


# --- filter_logits -------------------------------------------------------------------------


def test_top_k_keeps_exactly_the_k_best() -> None:
    logits = torch.tensor([0.3, 2.0, -1.0, 5.0, 1.0, 4.0])
    for k, expected in [(1, [3]), (2, [3, 5]), (3, [1, 3, 5]), (6, list(range(6))), (100, list(range(6)))]:
        out = filt(logits, k, 1.0)[0]
        assert kept(out) == expected, k
        assert torch.equal(out[expected], logits[expected]), "kept logits are unchanged"


@pytest.mark.parametrize("off", [0, -1])
def test_top_k_off_keeps_everything(off: int) -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(filt(logits, off, 1.0), logits)


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5 (1), 0.3 (3), 0.15 (2), 0.05 (0)
    logits = probs.log()
    cases = {0.01: [1], 0.45: [1], 0.55: [1, 3], 0.79: [1, 3], 0.81: [1, 2, 3], 0.94: [1, 2, 3], 0.96: [0, 1, 2, 3],
             1.0: [0, 1, 2, 3]}
    for p, expected in cases.items():
        assert kept(filt(logits, -1, p)[0]) == expected, p


def test_top_k_then_top_p_renormalises_over_the_top_k() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # top_k=2 leaves 0.4, 0.3 -> renormalised 0.571, 0.429: top_p=0.5 keeps only the best.
    assert kept(filt(probs.log(), 2, 0.5)[0]) == [0]
    assert kept(filt(probs.log(), 2, 0.6)[0]) == [0, 1]


def test_each_row_uses_its_own_settings() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]] * 3)
    out = filt(logits, [1, 3, -1], [1.0, 1.0, 0.01])
    assert [kept(r) for r in out] == [[1], [0, 1, 2], [1]]


def test_the_best_token_is_always_kept() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 300, generator=gen) * 5
    logits[0, 7] = 1e4  # one token with all the mass: any p keeps it alone
    out = filt(logits, 1, 1e-9)
    assert torch.equal(out.argmax(-1), logits.argmax(-1))
    assert all(len(kept(r)) == 1 for r in out)
    out = filt(logits, -1, 1e-9)
    assert all(kept(r) == [int(logits[i].argmax())] for i, r in enumerate(out))
    out = filt(logits, -1, 0.0)  # a top_p below float32's range arrives as 0: still the best token
    assert all(kept(r) == [int(logits[i].argmax())] for i, r in enumerate(out))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(1, 64),
    scale=st.floats(0.1, 20.0),
    top_k=st.integers(-1, 70),
    top_p=st.floats(0.01, 1.0),
)
def test_filter_properties(seed: int, vocab: int, scale: float, top_k: int, top_p: float) -> None:
    """Kept tokens are a top-ranked prefix, include the best, number at most k, and form the
    smallest prefix whose (top-k renormalised) probability reaches top_p."""
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)).double() * scale
    logits = logits.float()
    out = filt(logits, top_k, top_p)[0]
    keep = set(kept(out))
    order = logits.argsort(descending=True, stable=True).tolist()
    n = len(keep)
    assert 1 <= n <= (top_k if top_k > 0 else vocab)
    assert int(logits.argmax()) in keep
    # a prefix of the ranking (ties may swap equal logits, so compare values)
    assert sorted(logits[list(keep)].tolist(), reverse=True) == logits[order[:n]].tolist()
    k = top_k if top_k > 0 else vocab
    probs = logits[order[:k]].double().softmax(-1)
    mass = probs.cumsum(0)
    tol = 1e-5
    if n < k:  # stopped early because of top_p: the prefix reaches p, one token less did not
        assert mass[n - 1] >= top_p - tol
    if n > 1:
        assert mass[n - 2] < top_p + tol


# --- Sampler ---------------------------------------------------------------------------------


def test_all_greedy_batch_is_argmax() -> None:
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(2))
    reqs = [make_req(SamplingParams(temperature=0.0)), make_req(SamplingParams(temperature=0.7, top_k=1))] * 2
    reqs.append(make_req(SamplingParams()))
    assert Sampler()(logits, reqs) == logits.argmax(-1).tolist()


def test_greedy_rows_stay_argmax_in_a_mixed_batch() -> None:
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3))
    reqs = [make_req(SamplingParams(temperature=0.0 if i % 2 == 0 else 1.5), seed=i) for i in range(6)]
    out = Sampler()(logits, reqs)
    assert out[0::2] == logits.argmax(-1)[0::2].tolist()


def empirical(counts: torch.Tensor) -> torch.Tensor:
    return counts.double() / counts.sum()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_matches_softmax_statistics(temperature: float) -> None:
    """20,000 draws (unseeded rows, global RNG fixed): frequencies within 5 standard errors."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 20_000
    torch.manual_seed(0)
    reqs = [make_req(SamplingParams(temperature=temperature))] * n
    tokens = torch.tensor(Sampler()(logits.expand(n, -1).clone(), reqs))
    freq = empirical(torch.bincount(tokens, minlength=6))
    expected = (logits.double() / temperature).softmax(-1)
    stderr = (expected * (1 - expected) / n).sqrt()
    assert ((freq - expected).abs() <= 5 * stderr + 1e-9).all(), (freq, expected)


def test_seeded_rows_follow_the_distribution_and_their_own_generator() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    params = SamplingParams(temperature=1.0, top_k=3)  # token 2 (the worst) is filtered out
    req = make_req(params, seed=7)
    draws = torch.tensor([Sampler()(logits, [req])[0] for _ in range(4000)])
    counts = torch.bincount(draws, minlength=4)
    assert counts[2] == 0
    expected = torch.tensor([1.0, 0.0, 0.5]).double().softmax(-1)
    freq = empirical(counts[[0, 1, 3]])
    assert ((freq - expected).abs() < 0.03).all(), (freq, expected)
    # Same seed, same draws, whatever the batch around it and the global RNG; another seed differs.
    alone, in_batch, other = make_req(params, seed=7), make_req(params, seed=7), make_req(params, seed=8)
    torch.manual_seed(123)
    a = [Sampler()(logits, [alone])[0] for _ in range(50)]
    filler = make_req(SamplingParams(temperature=1.0))  # unseeded neighbours use the global RNG
    big = torch.cat([torch.randn(3, 4), logits, torch.randn(2, 4)])
    b = [Sampler()(big, [filler] * 3 + [in_batch] + [filler] * 2)[3] for _ in range(50)]
    c = [Sampler()(logits, [other])[0] for _ in range(50)]
    assert a == b and a != c


def test_low_temperature_concentrates_and_high_temperature_flattens() -> None:
    logits = torch.tensor([1.0, 0.8, 0.0, -0.5])
    n = 5000
    torch.manual_seed(1)
    share = {}
    for t in (0.1, 1.0, 10.0):
        tokens = torch.tensor(Sampler()(logits.expand(n, -1).clone(), [make_req(SamplingParams(temperature=t))] * n))
        share[t] = float((tokens == 0).double().mean())
    assert share[0.1] > 0.8 > share[1.0] > share[10.0] > 0.2


# --- log-probabilities -----------------------------------------------------------------------


def logprobs_of(logits: torch.Tensor, reqs: list[Req]) -> tuple[list[int], list]:
    """Sample, then ask for the log-probabilities as the engine does: tokens and per-row entries."""
    sampler = Sampler()
    tokens = sampler.sample(logits, reqs)
    found = sampler.logprobs(logits, reqs, tokens)
    return tokens.tolist(), (None if found is None else found.per_row(len(reqs)))


def test_logprobs_are_the_raw_log_softmax_gathered_and_its_top_k() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(4)) * 3
    asks = [None, 0, 3, 20, 5, None]
    reqs = [make_req(SamplingParams(temperature=0.0 if i % 2 == 0 else 0.7, top_k=7, top_p=0.8, logprobs=k), seed=i)
            for i, k in enumerate(asks)]
    tokens, rows = logprobs_of(logits, reqs)
    raw = torch.log_softmax(logits, dim=-1)
    assert rows is not None and len(rows) == 6
    for i, (k, token, row) in enumerate(zip(asks, tokens, rows)):
        if k is None:
            assert row is None, f"row {i} did not ask"
            continue
        assert row.logprob == pytest.approx(raw[i, token].item(), abs=1e-6)
        top_values, top_ids = raw[i].topk(k)
        assert [t for t, _ in row.top] == top_ids.tolist(), f"row {i}: the top {k} of the raw log-softmax"
        assert [v for _, v in row.top] == pytest.approx(top_values.tolist(), abs=1e-6)


def test_logprobs_are_taken_before_temperature_and_filters() -> None:
    """A token sampled at temperature 0.5 with top-k 3 has the model's logprob, not that of the
    scaled and filtered distribution it was drawn from (which is larger)."""
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(5)) * 2
    req = make_req(SamplingParams(temperature=0.5, top_k=3, logprobs=2), seed=11)
    (token,), (row,) = logprobs_of(logits, [req])
    raw = torch.log_softmax(logits[0], dim=-1)[token].item()
    scaled = torch.log_softmax(filt(logits / 0.5, 3, 1.0)[0], dim=-1)[token].item()
    assert row.logprob == pytest.approx(raw, abs=1e-6) and abs(scaled - raw) > 0.1


def test_logprobs_cost_nothing_when_nobody_asks(monkeypatch) -> None:
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(6))
    reqs = [make_req(SamplingParams()), make_req(SamplingParams(temperature=1.0), seed=1)] * 2

    def forbidden(*args, **kwargs):
        raise AssertionError("log_softmax computed although no request asked")

    monkeypatch.setattr(torch, "log_softmax", forbidden)
    monkeypatch.setattr(torch.Tensor, "log_softmax", forbidden)
    assert logprobs_of(logits, reqs)[1] is None


def test_logprobs_ask_for_more_than_the_vocabulary() -> None:
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(7))
    reqs = [make_req(SamplingParams(logprobs=20)), make_req(SamplingParams(logprobs=0))]
    _, (wide, bare) = logprobs_of(logits, reqs)
    assert len(wide.top) == 8 and bare.top == []


# --- SamplingParams ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2**63}, "top_k"),  # does not fit the sampler's int64
        ({"top_p": 1e-50}, "top_p"),  # 0 in float32
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),  # OpenAI's limit
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 2.0}, "logprobs"),
    ],
)
def test_invalid_sampling_params_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_valid_edge_values_and_greedy() -> None:
    for kwargs in ({"temperature": 0.0}, {"top_p": 1.0}, {"top_p": 1e-9}, {"top_k": -1}, {"top_k": 0},
                   {"max_tokens": 1}, {"temperature": 100.0}, {"logprobs": None}, {"logprobs": 0}, {"logprobs": 20}):
        SamplingParams(**kwargs)
    assert SamplingParams().greedy and SamplingParams(temperature=0.0, top_k=7).greedy
    assert SamplingParams(temperature=1.0, top_k=1).greedy
    assert not SamplingParams(temperature=1.0).greedy and not SamplingParams(temperature=1e-3, top_k=2).greedy
    params = SamplingParams()
    params.top_p = math.nan  # mutated later: validate() catches it
    with pytest.raises(ValueError, match="top_p"):
        params.validate()


def test_bf16_logits_sample_as_their_float32_values() -> None:
    """A GPU model hands the sampler bf16 logits (no float32 copy of ``[B, vocab]``). Converting
    bf16 to float32 is exact, so every row must get the token its float32 values give: greedy
    rows the same argmax (ties included), sampled rows the same draw from the same seed (the
    temperature, top-k / top-p and softmax in float32, not in bf16)."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 500, generator=gen) * 3).to(torch.bfloat16)
    logits[::4, [7, 300]] = 20.0  # every fourth row: a tie for the best token (argmax takes the first)
    settings = [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3, top_k=50)]
    params = [settings[i % 3] for i in range(64)]
    tokens = {}
    for dtype in (torch.bfloat16, torch.float32):
        reqs = [make_req(p, seed=i) for i, p in enumerate(params)]
        tokens[dtype] = Sampler().sample(logits.to(dtype), reqs).tolist()
    assert tokens[torch.bfloat16] == tokens[torch.float32]
