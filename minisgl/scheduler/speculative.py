"""Lesson 12: speculative decoding. Guess several tokens, check them all in one forward pass.

A decode step reads every weight of the model to produce one token per request; at small batch
sizes that read *is* the step. If we had a guess of the next ``k`` tokens, one forward pass over
``1 + k`` positions would cost barely more than over one, and would check every guess at once.
:class:`SpeculativeLoop` fills the scheduler's loop seam (lesson 4's
:class:`~minisgl.scheduler.scheduler.SyncLoop` shape: run a batch, process it, then the next) with
that idea. Each step:

1. **Propose.** The batching policy builds the step as usual (lesson 4's whole prompts or lesson
   6's token budget). When the batch is built (the loop's ``batch_built`` hook), every decode
   row asks the :class:`~minisgl.scheduler.ngram.Proposer` for up to ``k'`` draft tokens, with
   ``k' = min(k, max_tokens left - 1, max_seq_len - seq_len)`` and room in its KV pages, and
   the row is lengthened by them (:func:`add_drafts`): a *verify batch*. A request still in its
   prefill, or with no proposal, keeps its ordinary row in the same batch. Drafts are not
   counted in lesson 6's token budget: like decode tokens, they always go.
2. **Verify.** One forward pass writes KV for every position of every row and returns logits at
   every position of a speculating row; lesson 12's acceptance rule
   (:func:`~minisgl.engine.verify.verify`) picks each row's tokens: its accepted drafts, then
   one token of the target's own.
3. **Record and roll back.** Lesson 4's :meth:`Scheduler.process` records each row's first
   token as for any step (stop checks, finishing, freeing); the loop then appends the rest one
   by one, stopping where a stop token (or ``max_tokens``) ends the request, exactly where
   one-token-at-a-time decoding would have stopped. ``num_cached`` counts only verified KV: the
   last known token and each accepted draft that was appended. The KV written for rejected
   drafts is garbage past ``num_cached``, overwritten by later steps; with lesson 5's pages on
   demand, the pages holding nothing but such positions go back to the free list at once
   (:func:`release_unverified_pages`). The radix cache only ever receives pages below
   ``num_cached``, so it never holds an unverified token.

Why not with overlap scheduling (lesson 7) or CUDA graphs (lesson 8)? The lagged loop plans step
N+1 before it knows how many tokens step N accepted, so it cannot know the positions, the input
token or even the length of a row; and a captured graph replays fixed one-token rows. So
:meth:`~minisgl.engine.config.EngineConfig.resolve` turns overlap off with speculation, and CUDA
graphs are off (an explicit ``cuda_graph_max_bs > 0`` is refused).

Stop *strings* live in the text, outside the scheduler: the offline ``LLM`` (lesson 4's
``LocalEngine``) and the server's tokenizer worker (lesson 10) read a step's new tokens one by
one, so there too the output ends at the token that completed the stop string.

Each step that gives a request tokens is written down in ``req.spec_drafted`` /
``req.spec_accepted`` (what ``GenerationOutput`` reports), and :class:`AcceptanceStats` counts
verify rows by accepted tokens for the server's ``/metrics`` histogram.
"""

from __future__ import annotations

__lesson__ = 12

import logging
from dataclasses import dataclass, field

import torch

from minisgl.core import Batch, Req, ReqStatus
from minisgl.engine.verify import Verified, verify
from minisgl.scheduler.kv_manager import KVManager, PageOwner
from minisgl.scheduler.ngram import Proposer
from minisgl.scheduler.page_table import PageTable
from minisgl.scheduler.scheduler import Scheduler, SyncLoop

logger = logging.getLogger(__name__)


@dataclass
class AcceptanceStats:
    """Verify rows (a request's step with drafts) counted by accepted draft tokens:
    ``histogram[a]`` rows accepted ``a`` of their drafts (``0 <= a <= k``); ``drafted`` counts
    the draft tokens proposed. Every such step added ``a + 1`` tokens."""

    k: int
    histogram: list[int] = field(default_factory=list)
    drafted: int = 0

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.k + 1)

    def record(self, num_drafts: int, accepted: int) -> None:
        self.histogram[accepted] += 1
        self.drafted += num_drafts

    @property
    def steps(self) -> int:
        return sum(self.histogram)

    @property
    def accepted(self) -> int:
        return sum(a * n for a, n in enumerate(self.histogram))

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / proposed draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0


def add_drafts(batch: Batch, drafts: list[list[int]], page_table: PageTable) -> None:
    """Turn a built ``batch`` into a verify batch, in place: row ``i``'s new tokens are followed
    by ``drafts[i]`` (at the next positions), its extend length grows by ``len(drafts[i])``,
    and a sampling row asks for logits at its last known token and at every draft. The
    attention metadata is rebuilt for the longer rows (their pages must already hold them)."""
    ids, positions = batch.input_ids.tolist(), batch.positions.tolist()
    new_ids: list[int] = []
    new_positions: list[int] = []
    extend_lens: list[int] = []
    logits_at: list[int] = []
    start = 0
    for n, samples, row_drafts in zip(batch.extend_lens, batch.samples, drafts):
        first = positions[start]
        new_ids += ids[start:start + n] + row_drafts
        new_positions += range(first, first + n + len(row_drafts))
        extend_lens.append(n + len(row_drafts))
        if samples:  # the row's last known token, then each draft: 1 + len(drafts) logits
            logits_at += range(len(new_ids) - len(row_drafts) - 1, len(new_ids))
        start += n
    batch.input_ids = torch.tensor(new_ids)
    batch.positions = torch.tensor(new_positions)
    batch.extend_lens = extend_lens
    batch.logits_indices = torch.tensor(logits_at)
    batch.meta = page_table.metadata([r.table_row for r in batch.reqs], [r.num_cached for r in batch.reqs], extend_lens)
    batch.drafts = drafts
    batch.mode = "verify"


def release_unverified_pages(kv: PageOwner, req: Req) -> None:
    """After a verify step: give back ``req``'s pages that hold nothing but rejected drafts'
    KV (those past its verified ``num_cached`` tokens), as if it had decoded one token at a
    time. Lesson 4's :class:`KVManager` reserved the request's whole life at admission: there
    only ``num_cached`` moves and the pages stay reserved."""
    if isinstance(kv, KVManager):
        return
    keep = max(kv.pages_needed(req.num_cached), req.num_tree_pages)
    kv.allocator.free(kv.page_table.truncate(req.table_row, keep))


class SpeculativeLoop(SyncLoop):
    """The loop seam of :class:`~minisgl.scheduler.scheduler.Scheduler`, filled with
    draft-and-verify steps (see the module docstring). ``kv`` is the scheduler's KV manager,
    ``proposer`` makes the drafts, ``k`` (``num_speculative_tokens``) caps them per request and
    step, ``max_seq_len`` is the engine's cap on a request's length."""

    def __init__(self, kv: PageOwner, proposer: Proposer, k: int, max_seq_len: int) -> None:
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        self.kv = kv
        self.proposer = proposer
        self.k = k
        self.max_seq_len = max_seq_len
        self.acceptance = AcceptanceStats(k)

    # --- proposing ----------------------------------------------------------------------------
    def draft_limit(self, req: Req) -> int:
        """Most drafts ``req`` may propose now: ``k``, but no more than would let a fully
        accepted step (drafts + bonus) pass ``max_tokens``, nor write KV past ``max_seq_len``
        (implied by the first while ``add_request`` keeps prompt + max_tokens within it)."""
        return max(0, min(self.k, req.params.max_tokens - req.num_generated - 1, self.max_seq_len - req.seq_len))

    def make_room(self, req: Req, want: int) -> int:
        """How many of ``want`` drafts ``req``'s row can hold: a verify step writes KV at
        positions ``seq_len - 1 .. seq_len - 1 + k'``. Lesson 4's manager reserved the whole life,
        so they fit; lesson 5's takes pages on demand, and drafts get only *free* pages (a guess
        is not worth evicting a cached prefix, nor retracting a request)."""
        kv, table = self.kv, self.kv.page_table
        have = table.pages_in_row(req.table_row)
        room = have * kv.page_size - req.seq_len
        if want > room:
            extra = min(kv.pages_needed(req.seq_len + want) - have, kv.allocator.num_free)
            if extra > 0 and kv.ensure_capacity(req, (have + extra) * kv.page_size):
                room += extra * kv.page_size
        return max(0, min(want, room))

    def batch_built(self, batch: Batch) -> None:
        """Lengthen every decode row of ``batch`` by its request's drafts (if any)."""
        rows = [i for i, (n, samples, decoding) in enumerate(zip(batch.extend_lens, batch.samples, batch.decode_rows))
                if decoding and samples and n == 1]
        limits = [self.draft_limit(batch.reqs[i]) for i in rows]
        if not any(limits):
            return
        try:
            proposals = self.proposer.propose([batch.reqs[i] for i in rows], limits)
        except Exception:  # a draft model's forward failed: this step goes without drafts, nobody fails
            logger.exception("the proposer failed; decoding this step without drafts")
            for i in rows:
                self.proposer.release(batch.reqs[i])
            return
        drafts: list[list[int]] = [[] for _ in batch.reqs]
        for i, limit, proposal in zip(rows, limits, proposals):
            proposal = [int(t) for t in proposal[:limit]]
            if proposal:
                drafts[i] = proposal[:self.make_room(batch.reqs[i], len(proposal))]
        if any(drafts):
            add_drafts(batch, drafts, self.kv.page_table)

    # --- running and recording ----------------------------------------------------------------
    def step(self, sched: Scheduler, batch: Batch | None) -> list[Req]:
        """Run ``batch`` (a verify batch if any row got drafts) and record every row's tokens."""
        if batch is None:
            return super().step(sched, batch)
        try:
            if batch.drafts is None:  # nobody speculates this step: lesson 4's step exactly
                firsts = sched.engine.step(batch)
                verified = Verified([[t] for t in firsts], [0] * len(firsts),
                                    None if batch.logprobs is None else [[lp] for lp in batch.logprobs])
            else:
                verified = verify(sched.engine, batch)
        except Exception as exc:  # a kernel error, a sampler failure, ...: these requests fail alone
            logger.exception("batch of %d request(s) failed; finishing them with an error", batch.size)
            return sched.fail(batch.reqs, exc)
        return self.process(sched, batch, verified)

    def process(self, sched: Scheduler, batch: Batch, verified: Verified) -> list[Req]:
        """Record ``verified``: each row's first token through lesson 4's
        :meth:`Scheduler.process` (which books the batch, see :meth:`book`), then the rest of a
        speculating row's tokens here, each making the KV of the draft before it verified."""
        if verified.logprobs is not None:
            batch.logprobs = [lps[0] for lps in verified.logprobs]
        finished = sched.process(batch, [tokens[0] for tokens in verified.tokens])
        drafts = batch.drafts or [[] for _ in batch.reqs]
        sampling = [(req, d) for req, d, s in zip(batch.reqs, drafts, batch.samples) if s]
        logprobs = verified.logprobs or [[None] * len(t) for t in verified.tokens]
        for (req, row_drafts), tokens, accepted, lps in zip(sampling, verified.tokens, verified.accepted, logprobs):
            req.spec_drafted.append(len(row_drafts))
            req.spec_accepted.append(accepted)
            if not row_drafts:
                continue
            self.acceptance.record(len(row_drafts), accepted)
            for token, lp in zip(tokens[1:], lps[1:]):
                if req.status != ReqStatus.RUNNING:  # a stop token (or an abort) ended it earlier in the run
                    break
                req.num_cached += 1  # the token before this one was an accepted draft: its KV is verified
                req.append_token(token, lp)
                if req.finish_reason is not None:
                    sched.finish(req, req.finish_reason)
                    finished.append(req)
            if req.status == ReqStatus.RUNNING:
                release_unverified_pages(self.kv, req)
        return finished

    def release(self, sched: Scheduler, req: Req, cache: bool) -> None:
        """A request is finished: its KV goes back (lesson 4), and whatever the proposer keeps for
        it (a draft model's rows and pages)."""
        super().release(sched, req, cache)
        self.proposer.release(req)

    def book(self, batch: Batch) -> None:
        """The batch has run: each row's known tokens now have KV (its drafts count only as
        :meth:`process` accepts them)."""
        if batch.drafts is None:
            return super().book(batch)
        assert not batch.booked, "a batch is processed once"
        batch.booked = True
        for req, n, row_drafts in zip(batch.reqs, batch.extend_lens, batch.drafts):
            req.num_cached += n - len(row_drafts)
