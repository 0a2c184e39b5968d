"""Lesson 12: proposing draft tokens without a second model (n-gram / prompt lookup).

Speculative decoding needs guesses that are cheap to make and often right. Text repeats itself:
code repeats identifiers, a summary quotes its document, a chat answer restates the question,
and a model stuck in a loop repeats its own output. So look the sequence's most recent tokens up
earlier in the same sequence, prompt and output alike, and guess that what followed them then
follows them now::

    tokens   ... the  cat  sat  on  the  mat  .  The  cat  sat  |  ?
    suffix                                            cat  sat     (n = 2) found earlier at "cat sat"
    proposal                                                        on  the  mat  .   (k = 4)

The longest suffix wins (up to ``max_ngram`` tokens, down to ``min_ngram``), and its most recent
earlier occurrence: both are the likeliest to continue the same way. If what follows that
occurrence runs into the end of the sequence, the sequence is repeating itself with that period,
and the guess goes on repeating it (``a b c a b`` proposes ``c a b c``). No match, no proposal:
the request decodes one token as usual. A wrong guess costs only the extra positions of one verify
step (lesson 12's :mod:`minisgl.engine.verify`); it never changes the output.

A proposer is anything with :meth:`Proposer.propose`; the scheduler's speculative loop calls
it once per step for every decoding request, with a per-request limit.
"""

from __future__ import annotations

__lesson__ = 12

from collections.abc import Sequence
from typing import Protocol

from minisgl.core import Req


class Proposer(Protocol):
    """Where draft tokens come from: the n-gram lookup here, or a small draft model
    (:class:`~minisgl.scheduler.draft.DraftModelProposer`)."""

    def propose(self, reqs: Sequence[Req], limits: Sequence[int]) -> list[list[int]]:
        """For each decoding request, at most ``limits[i]`` draft tokens to follow its sequence
        (``req.all_ids``; fewer, or none, is fine). Called once per step for all of them, so
        a proposer that runs a model can batch them."""
        ...

    def release(self, req: Req) -> None:
        """``req`` finished: forget whatever the proposer kept for it (a draft model's KV)."""
        ...


class NgramProposer:
    """Prompt lookup: the longest recent suffix of a request's tokens (``max_ngram`` down to
    ``min_ngram`` tokens) found earlier in its prompt or output proposes what followed it."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, reqs: Sequence[Req], limits: Sequence[int]) -> list[list[int]]:
        return [self.lookup(req.all_ids, limit) if limit > 0 else [] for req, limit in zip(reqs, limits)]

    def release(self, req: Req) -> None:
        """Nothing kept per request: the lookup reads ``req.all_ids`` afresh every step."""

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
        ``tokens`` that occurs earlier at all (past the end of ``tokens``, the same period
        again); ``[]`` if none does."""
        tokens = list(tokens)
        end = len(tokens)
        if k <= 0 or end < 2:
            return []
        stops = _earlier_stops(tokens)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            suffix = tokens[end - n:]
            for stop in stops:
                if stop >= n and tokens[stop - n:stop] == suffix:
                    # Position end + i is guessed to repeat stop + i: read on past the end of
                    # the sequence in the guess itself (a loop of period end - stop).
                    guess: list[int] = []
                    for i in range(stop, stop + k):
                        guess.append(tokens[i] if i < end else guess[i - end])
                    return guess
        return []


class _earlier_stops:
    """Where an earlier occurrence of a suffix of ``tokens`` can end: just after each earlier
    copy of the last token, most recent first. Found lazily (``list.index`` searches in C) and
    kept, so trying several suffix lengths scans the tokens once, and a long run of one token
    costs only the few positions looked at."""

    def __init__(self, tokens: list[int]) -> None:
        self.end, self.last = len(tokens), tokens[-1]
        self.backwards = tokens[::-1]  # backwards[j] == tokens[end - 1 - j]
        self.found: list[int] = []
        self.searched = 0  # backwards[1 .. searched] have been searched
        self.exhausted = False

    def __iter__(self):
        i = 0
        while True:
            while i >= len(self.found):
                if self.exhausted:
                    return
                try:
                    self.searched = self.backwards.index(self.last, self.searched + 1)
                except ValueError:
                    self.exhausted = True
                    return
                self.found.append(self.end - self.searched)
            yield self.found[i]
            i += 1
