"""Lesson 4: turn each request's logits into its next token.

All-greedy batches take one argmax, on the logits as the model produced them (bf16 on a GPU:
converting to float32 is exact, so the argmax is the same, without writing and reading a float32
copy of ``[B, vocab]``). Otherwise each sampled row is converted to float32, scaled by its
temperature and filtered by top-k / top-p before sampling. Seeded requests sample with their own generator,
so their output does not depend on what else shares the batch. On CUDA, unseeded rows use
FlashInfer's fused top-k/top-p sampling kernel.

Requests that ask for log-probabilities (``SamplingParams.logprobs``) get them from
:meth:`Sampler.logprobs`: the chosen token's and the top-k's, from the raw logits. Only those
rows pay for it; a batch where nobody asks computes nothing more.
"""

from __future__ import annotations

__lesson__ = 4

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minisgl.core import Req, TokenLogprobs
from minisgl.utils import flashinfer_available


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf everything outside each row's top-k and top-p nucleus. ``logits [B, V]`` float32.

    ``top_k [B]`` int64 (<= 0 means off), ``top_p [B]`` float32 in (0, 1].
    """
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, V)[:, None]
    remove = rank >= k
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # Drop a token if the tokens ranked before it already reach top_p (the best token always
    # stays). Rows with top_p == 1 are left alone: float32 cumsums can round up to 1 early.
    remove |= ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (top_p[:, None] < 1)
    remove[:, 0] = False  # even where top_p is 0 (0 >= 0 would drop it, and the row would be NaN)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


@dataclass
class Logprobs:
    """The log-probabilities one step computed, for the sampling rows whose request asked.

    ``rows`` are those rows (indices among the step's ``S`` sampling rows) and ``ks`` how many
    alternatives each asked for; both on the host. ``values [R, 1 + K]`` float32 holds, per
    row, the chosen token's logprob (column 0) and then the top ``K`` logprobs, best first;
    ``ids [R, K]`` int64 the top tokens. ``K = max(ks)`` (at most the vocabulary size); row
    ``i`` reads its first ``ks[i]`` of them. The tensors stay where the logits were (the
    device) until the host reads them (:meth:`per_row`).
    """

    rows: list[int]
    ks: list[int]
    values: torch.Tensor
    ids: torch.Tensor

    def per_row(self, num_rows: int) -> list[TokenLogprobs | None]:
        """One entry per sampling row of the step (``num_rows`` = S), None where not asked.
        Reading the values waits for the device if they are still being computed there."""
        out: list[TokenLogprobs | None] = [None] * num_rows
        for row, k, values, ids in zip(self.rows, self.ks, self.values.tolist(), self.ids.tolist()):
            out[row] = TokenLogprobs(values[0], list(zip(ids[:k], values[1:k + 1])))
        return out


class Sampler:
    def __call__(self, logits: torch.Tensor, reqs: Sequence[Req]) -> list[int]:
        """``logits [B, V]`` (any float dtype) for ``reqs`` (same order) -> one token id per request."""
        return self.sample(logits, reqs).tolist()

    def sample(self, logits: torch.Tensor, reqs: Sequence[Req]) -> torch.Tensor:
        """Like calling the sampler, but the ``[B]`` int64 tokens stay where the logits are
        (lesson 7: nothing here waits for the device)."""
        greedy = [r.params.greedy for r in reqs]
        tokens = logits.argmax(dim=-1)
        if all(greedy):
            return tokens
        device = logits.device
        rows = [i for i, g in enumerate(greedy) if not g]
        params = [reqs[i].params for i in rows]
        temp = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float32)
        top_k = torch.tensor([p.top_k for p in params], device=device, dtype=torch.int64)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
        scaled = logits[rows].float() / temp[:, None]  # float32 from here on
        seeded = [j for j, i in enumerate(rows) if reqs[i].generator is not None]
        unseeded = [j for j, i in enumerate(rows) if reqs[i].generator is None]
        sampled = torch.empty(len(rows), dtype=torch.int64, device=device)
        if unseeded and device.type == "cuda" and flashinfer_available():
            import flashinfer

            idx = torch.tensor(unseeded, device=device)
            k = torch.where(top_k[idx] > 0, top_k[idx], logits.shape[-1]).to(torch.int32)
            sampled[idx] = flashinfer.sampling.top_k_top_p_sampling_from_logits(scaled[idx], k, top_p[idx]).long()
        elif unseeded:
            idx = torch.tensor(unseeded, device=device)
            probs = filter_logits(scaled[idx], top_k[idx], top_p[idx]).softmax(dim=-1)
            sampled[idx] = torch.multinomial(probs, 1).squeeze(1)
        for j in seeded:  # one draw per step from the request's own generator
            probs = filter_logits(scaled[j:j + 1], top_k[j:j + 1], top_p[j:j + 1]).softmax(dim=-1)
            sampled[j] = torch.multinomial(probs, 1, generator=reqs[rows[j]].generator)[0, 0]
        tokens[torch.tensor(rows, device=device)] = sampled
        return tokens

    def logprobs(self, logits: torch.Tensor, reqs: Sequence[Req], tokens: torch.Tensor) -> Logprobs | None:
        """The log-probabilities of the rows whose request asks (``params.logprobs`` not None),
        or None, having computed nothing, if none does. ``logits [B, V]`` as the model
        produced them, ``tokens [B]`` int64 the tokens this step chose (:meth:`sample`).

        Convention: ``log_softmax`` of the *raw* logits, before temperature, top-k and top-p,
        as OpenAI reports them and vLLM does by default ("raw logprobs"). They describe the
        model, not the sampling settings: a token drawn at temperature 0.7, or one that top-p
        kept, has the logprob the model gives it, and the top-k alternatives are the model's
        k most likely tokens even where sampling could not have picked them.
        """
        asked = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if not asked:
            return None
        if len(asked) < len(reqs):
            idx = torch.tensor(asked, device=logits.device)
            logits, tokens = logits[idx], tokens[idx]
        logp = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
        asks = [reqs[i].params.logprobs for i in asked]
        k = min(max(asks), logp.shape[-1])
        top_values, top_ids = logp.topk(k, dim=-1)  # [R, K] each (K may be 0)
        values = torch.cat([logp.gather(1, tokens[:, None]), top_values], dim=1)
        return Logprobs(asked, [min(a, k) for a in asks], values, top_ids)
