"""Lesson 6: chunked prefill. A step is a token budget, not a kind of batch.

Lesson 4's :class:`~minisgl.scheduler.scheduler.WholePrompts` runs either a prefill or a decode
step, so one 32k-token prompt stalls every running request for a whole forward pass of its
own. :class:`ChunkedPrefill` fills each step with about ``budget`` tokens instead: every
decoding request's next token, new prompts, and the next *chunk* of a prompt too long to fit.
One batch mixes all three (``Batch.mode == "mixed"``). A chunk that does not reach the end of
its prompt writes KV and samples nothing (``Batch.samples``), so a seeded request's generator
is advanced only by its final chunk and its tokens do not depend on the budget.
"""

from __future__ import annotations

__lesson__ = 6

from minisgl.core import Batch, Req
from minisgl.scheduler.scheduler import Scheduler


class ChunkedPrefill:
    """The batching seam of :class:`~minisgl.scheduler.scheduler.Scheduler`, filled with a
    per-step token budget (``chunked_prefill_size``)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def next_batch(self, sched: Scheduler) -> Batch | None:
        """One batch of about ``budget`` tokens, filled in this order:

        1. one token for every decoding request (always, even past the budget);
        2. new requests, first come first served, each with its whole uncached prompt while it
           fits what is left; the first one that does not fit starts chunking only as the
           step's one prompt (no other prompt mid-prefill, none admitted before it this step),
           otherwise it waits;
        3. the next chunk of the request(s) still prefilling, with whatever is left.

        Short requests that arrive behind a long prompt therefore start at once instead of
        waiting for all its chunks, and at most one prompt at a time is being chunked."""
        if not sched.running and not sched.waiting:
            return None
        budget = self.budget
        decoding = sched.make_room_for_decode()
        prefilling = [r for r in sched.running if not r.decoding]
        reqs, chunks = list(decoding), [1] * len(decoding)
        budget -= len(decoding)
        admitted: list[Req] = []
        while budget > 0 and sched.waiting and len(sched.running) < sched.config.max_running:
            req = sched.waiting[0]
            # Waits (changing nothing) if its whole prompt does not fit while another prompt is
            # mid-prefill (no second chunked prompt), or if a prefix of it is on its way.
            if not sched.admit(req, prefilling + admitted, budget):
                break
            new_tokens = req.seq_len - req.num_cached
            reqs.append(req)
            chunks.append(min(new_tokens, budget))
            budget -= chunks[-1]
            admitted.append(req)
        for req in prefilling:
            if budget <= 0:
                break
            reqs.append(req)
            chunks.append(min(req.seq_len - req.num_cached, budget))
            budget -= chunks[-1]
        return sched.build_batch(reqs, chunks) if reqs else None
