"""Lesson 4: the manager that owns the page allocator and the page table.

It admits a request (a page-table row plus the pages it will need) and releases it. Both are
all-or-nothing: a call that raises changes nothing, so an error can never leak a row or a page.
"""

from __future__ import annotations

__lesson__ = 4

from collections.abc import Sequence
from dataclasses import dataclass

from minisgl.core import Req
from minisgl.kvcache.allocator import BlockAllocator, OutOfBlocksError
from minisgl.scheduler.page_table import PageTable
from minisgl.utils import cdiv


@dataclass
class CacheStats:
    """Counters a notebook or ``/metrics`` can read (all but ``prompt_tokens`` stay 0 without
    lesson 5's prefix cache)."""

    prompt_tokens: int = 0  # prompt tokens of first admissions
    hit_tokens: int = 0  # of those, served from the prefix cache
    evicted_pages: int = 0
    retractions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PageOwner:
    """What every page manager holds: the page allocator (lesson 2's free list, over page ids),
    the page table, and the counters. Lesson 4's :class:`KVManager` and lesson 5's
    :class:`~minisgl.scheduler.cache_manager.CacheManager` build on it."""

    def __init__(self, num_pages: int, page_size: int, max_running: int, max_seq_len: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.allocator = BlockAllocator(num_pages)
        self.page_table = PageTable(max_running, cdiv(max_seq_len, page_size), page_size)
        self.stats = CacheStats()

    def pages_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.page_size)

    def owned_pages(self) -> int:
        """Pages that are not free."""
        return self.num_pages - self.allocator.num_free


class KVManager(PageOwner):
    """Owns the page allocator and the page table (see :class:`PageOwner`).

    Policy: a request reserves pages for its whole life (prompt + max_tokens) when it is
    admitted, so a running request can never run out of KV mid-decode and nothing ever needs
    to be preempted. Requests that do not fit yet simply wait.

    Invariant: ``allocator.num_free`` + the pages listed in occupied rows == ``num_pages``.
    """

    def can_admit(self, num_tokens: int) -> bool:
        return self.page_table.num_free_rows > 0 and self.pages_needed(num_tokens) <= self.allocator.num_free

    def admit(self, num_tokens: int) -> int:
        """Reserve a row and the pages for ``num_tokens`` positions; return the row.

        All-or-nothing: raises (:class:`OutOfBlocksError` when the pages do not fit, ``ValueError``
        when they would overflow a row) and changes nothing."""
        need = self.pages_needed(num_tokens)
        if need > self.page_table.table.shape[1]:
            raise ValueError(f"{num_tokens} tokens need {need} pages, more than a page-table row holds")
        if need > self.allocator.num_free:
            raise OutOfBlocksError(need, self.allocator.num_free)
        row = self.page_table.alloc_row()
        self.page_table.append_pages(row, self.allocator.alloc(need))
        return row

    def release(self, row: int) -> None:
        """Free the row's pages and the row itself."""
        self.allocator.free(self.page_table.pages(row))
        self.page_table.free_row(row)

    # --- what the scheduler calls (lesson 5's CacheManager answers the same calls) -----------
    def admit_request(self, req: Req, running: Sequence[Req] = ()) -> bool:
        """Give ``req`` a row and its whole life's pages if they fit now; else change nothing.
        (``running`` needs no room kept for it: every running request reserved its whole life.)"""
        if not self.can_admit(req.length_limit):
            return False
        req.table_row = self.admit(req.length_limit)
        req.num_cached = 0  # no prefix cache in this lesson
        return True

    def ensure_capacity(self, req: Req, num_tokens: int) -> bool:
        """Room for ``num_tokens`` positions: always, since admission reserved the whole life."""
        return num_tokens <= self.page_table.pages_in_row(req.table_row) * self.page_size

    def release_request(self, req: Req, cache: bool = True) -> None:
        """Free the request's row and pages exactly once (``cache`` only matters in lesson 5)."""
        if req.table_row >= 0:
            row, req.table_row = req.table_row, -1
            self.release(row)

    def cache_prefix(self, req: Req, num_valid: int | None = None) -> None:
        """Nothing to share without a prefix cache (lesson 5's CacheManager shares it)."""

    def shares_prefix(self, req: Req, others: Sequence[Req]) -> bool:
        """Whether waiting a step would let ``req`` reuse a prefix ``others`` are computing:
        never, without a prefix cache."""
        return False

    def make_room_for_decode(self, running: Sequence[Req]) -> tuple[list[Req], list[Req]]:
        """``(decoding, retracted)``: the ``running`` requests that decode this step, in running
        order (every one past its prefill that still wants a token; their pages were reserved at
        admission), and the ones retracted to make room for them (none here: lesson 5 retracts)."""
        return [r for r in running if r.decoding and r.wants_more], []

