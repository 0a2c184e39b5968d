"""Lesson 12: verification. The target model checks a request's draft tokens in one forward pass.

A *verify batch* (made by lesson 12's :class:`~minisgl.scheduler.speculative.SpeculativeLoop`)
is an ordinary ragged batch over the paged KV. A speculating request's row is its last known
token ``L`` (at position ``P``, the only token of a plain decode row) followed by its ``k'``
draft tokens, and the batch asks for logits at every one of those positions::

    inputs    L    d1   d2   ...  dk'      positions P .. P + k'  (extend length 1 + k')
    logits    y0   y1   y2   ...  yk'      y_j: the target's next token after inputs 0..j

``y0`` is what a plain decode step would have produced; it judges ``d1``. ``y1`` was computed
as if ``d1`` were right, so it judges ``d2`` only if ``d1`` was accepted, and so on. If every
draft is right, ``yk'`` is a free extra token (the *bonus*). One forward pass therefore adds
between 1 and ``k' + 1`` tokens, each exactly what one-token-at-a-time decoding would have
produced. Attention needs nothing new: a row of ``1 + k'`` new tokens over cached KV is what
chunked prefill (lesson 6) already runs, causal mask included.

**Greedy** (:func:`accept_greedy`): accept the longest prefix of drafts with ``d_{j+1} == y_j``;
the row adds those ``a`` drafts and then ``y_a``, the target's own token where the first draft
failed (or the bonus, ``a = k'``).

**Sampling** (temperature > 0, :func:`accept_sampled`). Let ``p_j`` be the distribution the
plain sampler would draw from at position ``j`` (temperature, top-k and top-p applied). The
n-gram proposer's guess is certain, a point mass ``q = [x == d]``, so the general rule "accept
``d`` with probability ``min(1, p(d) / q(d))``, else draw from ``max(0, p - q)`` renormalised"
becomes: accept ``d`` with probability ``p(d)``; otherwise draw from ``p`` with ``d`` removed,
renormalised. The token emitted is then distributed exactly as ``p``:

    P(x = d) = p(d)                                     (accepted)
    P(x = t) = (1 - p(d)) * p(t) / (1 - p(d)) = p(t)    for t != d  (rejected, then drawn)

so, position by position, the output has the target's distribution, as if each token had been
sampled alone. (A seeded request draws from its own generator, so its tokens are reproducible,
but they differ from the same seed without speculation: the draws are used differently.)

Only a speculating row is handled here; every other sampling row of the batch (a plain decode,
a prompt's final chunk) goes to lesson 4's sampler unchanged. The greedy rows read the device
once per step (one ``argmax``, as a plain step does); the sampling rule walks a row's drafts one
by one, which is fine on the CPU (a GPU path would run it for all rows at once on the device).
"""

from __future__ import annotations

__lesson__ = 12

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minisgl.core import Batch, Req, TokenLogprobs
from minisgl.engine.engine import Engine
from minisgl.engine.sampler import filter_logits


def accept_greedy(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading ``drafts`` the target accepts: ``drafts[j]`` is accepted when it equals
    ``targets[j]`` (the target's argmax after the row's first ``j + 1`` inputs) and every draft
    before it was accepted. ``len(targets) == len(drafts) + 1``."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return accepted


def greedy_tokens(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a greedy speculating row adds: its accepted drafts, then the target's own
    token at the first rejected position, or the bonus token if none was rejected."""
    accepted = accept_greedy(drafts, targets)
    return list(drafts[:accepted]) + [targets[accepted]]


def accept_sampled(probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None = None) -> list[int]:
    """The tokens a sampling speculating row adds. ``probs [k' + 1, V]`` float32: row ``j`` is
    the target's distribution after the row's first ``j + 1`` inputs, as the plain sampler would
    draw from it; ``drafts``: the ``k'`` draft tokens (each proposed with certainty).

    Draft ``d`` at position ``j`` is accepted with probability ``p_j(d)``; the first one
    rejected is replaced by a draw from ``p_j`` without ``d`` (renormalised) and ends the row;
    if none is rejected, a bonus token is drawn from ``p_k'``. ``generator``: the request's
    own (seeded) one, or None for torch's global generator."""
    out: list[int] = []
    for j, draft in enumerate(drafts):
        p = probs[j]
        u = torch.rand((), generator=generator, device=p.device)
        if u < p[draft]:
            out.append(int(draft))
            continue
        residual = p.clone()
        residual[draft] = 0.0  # p with the rejected draft removed (multinomial renormalises)
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out


def target_probs(logits: torch.Tensor, req: Req) -> torch.Tensor:
    """``[n, V]`` float32: what lesson 4's sampler would draw from for ``req`` at each of the
    ``logits [n, V]`` rows (temperature, then top-k and top-p)."""
    p = req.params
    n = logits.shape[0]
    top_k = torch.full((n,), p.top_k, dtype=torch.int64, device=logits.device)
    top_p = torch.full((n,), p.top_p, dtype=torch.float32, device=logits.device)
    return filter_logits(logits.float() / p.temperature, top_k, top_p).softmax(dim=-1)


@dataclass
class Verified:
    """What a verify step gives each *sampling* row of its batch (``batch.sampling_reqs``, in
    order): ``tokens[i]``, the tokens row ``i`` adds (a speculating row: ``accepted[i]`` drafts,
    then the target's own token; any other row: its one sampled token), and, where the request
    asked for them, one :class:`TokenLogprobs` per token (``logprobs`` None if no row asked)."""

    tokens: list[list[int]]
    accepted: list[int]
    logprobs: list[list[TokenLogprobs | None]] | None = None


def verify(engine: Engine, batch: Batch) -> Verified:
    """Run the verify ``batch`` (``batch.drafts`` set) through ``engine``'s model once and decide
    every sampling row's tokens: speculating rows by the acceptance rule (greedy or sampling,
    per request), the others by the engine's sampler exactly as a plain step would."""
    assert batch.drafts is not None, "a verify batch lists its drafts"
    logits = engine.forward(batch)  # [N, V]: every position of a speculating row, the last of the others
    reqs = batch.sampling_reqs
    drafts = [d for d, s in zip(batch.drafts, batch.samples) if s]
    spans = [1 + len(d) for d in drafts]  # logits rows per sampling row
    starts = list(itertools.accumulate(spans, initial=0))
    assert starts[-1] == logits.shape[0], "logits_indices must cover every position of a speculating row"
    tokens: list[list[int]] = [[] for _ in reqs]
    accepted = [0] * len(reqs)
    plain = [i for i, d in enumerate(drafts) if not d]
    if plain:  # lesson 4's sampler, on the rows that do not speculate
        rows = torch.tensor([starts[i] for i in plain], device=logits.device)
        for i, t in zip(plain, engine.sampler.sample(logits[rows], [reqs[i] for i in plain]).tolist()):
            tokens[i] = [t]
    greedy = [i for i, d in enumerate(drafts) if d and reqs[i].params.greedy]
    if greedy:
        argmax = logits.argmax(dim=-1).tolist()  # one read of the device for every greedy row
        for i in greedy:
            targets = argmax[starts[i]:starts[i + 1]]
            accepted[i] = accept_greedy(drafts[i], targets)
            tokens[i] = greedy_tokens(drafts[i], targets)
    for i, d in enumerate(drafts):
        if d and not reqs[i].params.greedy:
            probs = target_probs(logits[starts[i]:starts[i + 1]], reqs[i])
            tokens[i] = accept_sampled(probs, d, reqs[i].generator)
            accepted[i] = len(tokens[i]) - 1
    return Verified(tokens, accepted, _logprobs(engine, logits, reqs, starts, tokens))


def _logprobs(engine: Engine, logits: torch.Tensor, reqs: list[Req], starts: list[int],
              tokens: list[list[int]]) -> list[list[TokenLogprobs | None]] | None:
    """Per sampling row, the log-probabilities of each token it adds (from the logits at that
    token's position, as lesson 4's sampler reports them), for the rows that asked; None if
    none did."""
    asked = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
    if not asked:
        return None
    rows = [starts[i] + j for i in asked for j in range(len(tokens[i]))]
    chosen = [t for i in asked for t in tokens[i]]
    per_token_reqs = [reqs[i] for i in asked for _ in tokens[i]]
    index = torch.tensor(rows, device=logits.device)
    found = engine.sampler.logprobs(logits[index], per_token_reqs, torch.tensor(chosen, device=logits.device))
    flat = iter(found.per_row(len(rows)))
    out: list[list[TokenLogprobs | None]] = [[None] * len(t) for t in tokens]
    for i in asked:
        out[i] = [next(flat) for _ in tokens[i]]
    return out
