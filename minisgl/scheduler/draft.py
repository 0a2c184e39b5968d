"""Lesson 12: proposing draft tokens with a small model (the draft-model proposer).

The n-gram proposer (:mod:`minisgl.scheduler.ngram`) guesses only where the text repeats
itself. A *draft model* guesses everywhere: a much smaller model that shares the target's
tokenizer runs ``k`` ordinary greedy decode steps, and its tokens are the drafts. It is cheap
because it is small (the demo's draft is a fraction of the demo's size); it is useful because a
small model trained on the same kind of text agrees with the big one on the easy tokens, and
most tokens are easy.

The draft lives in the same engine, beside the target: its own model, its own paged KV pool
and page table (lesson 4's pieces), driven by lesson 4's :class:`~minisgl.engine.engine.Engine`.
Each request that speculates owns one row of the draft's page table, and the proposer remembers
which tokens the draft has KV for (``fed``). One call of :meth:`DraftModelProposer.propose`,
for all the decoding requests of a step at once::

    target tokens  t0 t1 ... t(n-1)                 (prompt + output so far)
    draft holds    t0 t1 ... t(c-1)                 (c: where fed and the tokens agree)
    forward 1      t(c) ... t(n-1)       -> d1      (catch-up rows: a prefill, or 1-2 tokens)
    forward 2      d1                    -> d2      (one-token decode rows)
    ...
    forward k      d(k-1)                -> dk

**Rollback is free.** After the target verifies, the request's tokens are its old ones, the
accepted drafts and one token of the target's. What the draft fed is its old tokens and
``d1 .. d(k-1)``: the longest common prefix of the two is exactly the draft KV that is still
right, and the next call simply continues from there (the positions past it are overwritten;
pages past it go back to the free list at once). Because the last token of a request is never
fed before it is known, each catch-up row has at least one new token.

The drafts are the draft model's *greedy* tokens, a point mass ``q``, so lesson 12's acceptance
rule (:mod:`minisgl.engine.verify`) applies unchanged, for greedy and sampling requests alike;
sampling the drafts from ``q`` with the full ``min(1, p/q)`` rule would accept a little more at
temperature > 0 (not done here).

Pages: the draft pool is sized beside the target's (:func:`minisgl.engine.builder.build_local`).
The draft has no prefix cache of its own, so requests that share a cached prompt each hold a
copy in the draft pool. When the pool runs short, rows of requests that are not decoding this
step (retracted, waiting) are evicted first, then a request gets fewer drafts, or none: a guess
is never worth failing a request. After every step, ``free + held by rows == num_pages``
(:meth:`DraftModelProposer.check_pages`).

Under tensor parallelism (lesson 9) every rank runs the whole draft on the same tokens; rank
0's drafts are then broadcast, so the ranks verify identical rows even if two GPUs rounded
differently.
"""

from __future__ import annotations

__lesson__ = 12

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from minisgl.core import Batch, Req
from minisgl.engine.engine import Engine
from minisgl.scheduler.kv_manager import PageOwner


@dataclass
class DraftRow:
    """One request's place in the draft model's KV: its page-table ``row`` and ``fed``, the tokens
    whose KV the draft holds, at positions ``0 .. len(fed) - 1``."""

    row: int
    fed: list[int] = field(default_factory=list)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class DraftModelProposer:
    """Drafts from a small model (see the module docstring). ``engine`` runs the draft model over
    its own pool (``engine.backend.pool``); ``max_running`` rows of ``max_seq_len`` tokens at most
    (the target's limits: a request never speculates past ``max_seq_len``)."""

    def __init__(self, engine: Engine, max_running: int, max_seq_len: int) -> None:
        pool = engine.backend.pool
        self.engine = engine
        self.kv = PageOwner(pool.num_pages, pool.page_size, max_running, max_seq_len)
        self.rows: dict[int, DraftRow] = {}  # by request id

    # --- pages ----------------------------------------------------------------------------------
    def _fit(self, state: DraftRow, num_tokens: int, keep: set[int]) -> int:
        """Give ``state``'s row pages for up to ``num_tokens`` positions (dropping pages past that),
        evicting rows not in ``keep`` if the pool is short; returns the positions it holds."""
        table, allocator = self.kv.page_table, self.kv.allocator
        want = min(self.kv.pages_needed(num_tokens), table.table.shape[1])
        have = table.pages_in_row(state.row)
        if have > want:
            allocator.free(table.truncate(state.row, want))
            have = want
        if want > have + allocator.num_free:
            for rid in [r for r in self.rows if r not in keep]:
                self._drop(rid)
                if want <= have + allocator.num_free:
                    break
        extra = min(want - have, allocator.num_free)
        if extra > 0:
            table.append_pages(state.row, allocator.alloc(extra))
        return (have + extra) * self.kv.page_size

    def _drop(self, rid: int) -> None:
        state = self.rows.pop(rid)
        self.kv.allocator.free(self.kv.page_table.pages(state.row))
        self.kv.page_table.free_row(state.row)

    def release(self, req: Req) -> None:
        """``req`` is finished (or failed): its draft row and pages go back. Idempotent."""
        if req.rid in self.rows:
            self._drop(req.rid)

    def check_pages(self) -> None:
        """The draft pool's invariant: free pages + pages held by rows == the pool."""
        held = sum(self.kv.page_table.pages_in_row(s.row) for s in self.rows.values())
        assert self.kv.allocator.num_free + held == self.kv.num_pages, (self.kv.allocator.num_free, held)

    # --- proposing ------------------------------------------------------------------------------
    def propose(self, reqs: Sequence[Req], limits: Sequence[int]) -> list[list[int]]:
        """Up to ``limits[i]`` greedy draft tokens for each of ``reqs`` (their sequences:
        ``req.all_ids``), from ``max(limits)`` forward passes of the draft model over all the
        requests at once."""
        drafts: list[list[int]] = [[] for _ in reqs]
        keep = {r.rid for r in reqs}
        live: list[tuple[int, DraftRow, int]] = []  # (index in reqs, its row, its limit)
        for i, (req, limit) in enumerate(zip(reqs, limits)):
            if limit <= 0:
                continue
            state = self.rows.get(req.rid)
            if state is None:
                if self.kv.page_table.num_free_rows == 0:
                    continue
                state = self.rows[req.rid] = DraftRow(self.kv.page_table.alloc_row())
            tokens = req.all_ids
            self.rollback(state, tokens)
            # the KV it will write: the uncached tokens, then drafts 1 .. limit-1
            room = self._fit(state, len(tokens) + limit - 1, keep)
            limit = min(limit, room - len(tokens) + 1)
            if limit <= 0:
                continue
            live.append((i, state, limit))
        if not live:
            return drafts
        # Forward 1: each row catches up with its request's tokens and drafts one token.
        new = [reqs[i].all_ids[len(s.fed):] for i, s, _ in live]
        firsts = self._greedy([s for _, s, _ in live], new)
        for (i, state, _), tokens, token in zip(live, new, firsts):
            state.fed += tokens
            drafts[i].append(token)
        # Forwards 2..: one token each, for the rows that want more.
        for j in range(1, max(limit for _, _, limit in live)):
            going = [(i, s) for i, s, limit in live if limit > j]
            nexts = self._greedy([s for _, s in going], [[drafts[i][-1]] for i, _ in going])
            for (i, state), token in zip(going, nexts):
                state.fed.append(drafts[i][-1])
                drafts[i].append(token)
        return self._agree(drafts)

    def rollback(self, state: DraftRow, tokens: list[int]) -> None:
        """Forget the draft KV that no longer matches the request's ``tokens``: keep the longest
        common prefix of ``state.fed`` and ``tokens``, but never the last token (the next forward
        must feed it, for its logits). After a verify step that keeps the old tokens and the
        accepted drafts; the first rejected draft and all fed after it are dropped (their
        positions are overwritten, their pages freed by the next :meth:`_fit`)."""
        del state.fed[min(common_prefix(state.fed, tokens), len(tokens) - 1):]

    def _greedy(self, states: list[DraftRow], new: list[list[int]]) -> list[int]:
        """One draft forward: row ``i`` appends ``new[i]`` after its ``fed`` tokens; returns each
        row's argmax next token."""
        extend = [len(n) for n in new]
        cached = [len(s.fed) for s in states]
        meta = self.kv.page_table.metadata([s.row for s in states], cached, extend)
        ids = torch.tensor([t for n in new for t in n])
        positions = torch.tensor([p for c, n in zip(cached, extend) for p in range(c, c + n)])
        last = torch.tensor(list(itertools.accumulate(extend))) - 1
        mode = "decode" if all(n == 1 for n in extend) else "prefill"
        batch = Batch(mode, [], extend, ids, positions, last, meta, samples=[], decode_rows=[], cached_after=[],
                      sample_rows=torch.zeros(0, dtype=torch.int64))
        return self.engine.forward(batch).argmax(dim=-1).tolist()

    def _agree(self, drafts: list[list[int]]) -> list[list[int]]:
        """Under tensor parallelism: every rank takes rank 0's drafts (same lengths everywhere:
        the ranks schedule alike and size their draft pools alike)."""
        from minisgl.distributed.tp import get_tp

        tp = get_tp()
        if tp.size == 1 or not any(drafts):
            return drafts
        import torch.distributed as dist

        flat = torch.tensor([t for d in drafts for t in d], dtype=torch.int64)
        if dist.get_backend(tp.group) == "nccl":
            flat = flat.cuda()
        dist.broadcast(flat, src=dist.get_global_rank(tp.group, 0) if tp.group is not None else 0, group=tp.group)
        values = iter(flat.tolist())
        return [[next(values) for _ in d] for d in drafts]
