"""Lesson 4: turn each request's logits into its next token.

All-greedy batches take one argmax. Otherwise each row is scaled by its temperature and
filtered by top-k / top-p before sampling. Seeded requests sample with their own generator,
so their output does not depend on what else shares the batch. On CUDA, unseeded rows use
FlashInfer's fused top-k/top-p sampling kernel.
"""

from __future__ import annotations

__lesson__ = 4

from collections.abc import Sequence

import torch

from minisgl.core import Req
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


class Sampler:
    def __call__(self, logits: torch.Tensor, reqs: Sequence[Req]) -> list[int]:
        """``logits [B, V]`` float32 for ``reqs`` (same order) -> one token id per request."""
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
        scaled = logits[rows] / temp[:, None]
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
