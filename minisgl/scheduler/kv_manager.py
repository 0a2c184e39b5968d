"""Lesson 4: the manager that owns the page allocator and the page table.

It admits a request (a page-table row plus the pages it will need) and releases it. Both are
all-or-nothing: a call that raises changes nothing, so an error can never leak a row or a page.
"""

from __future__ import annotations

from minisgl.kvcache.allocator import BlockAllocator, OutOfBlocksError
from minisgl.scheduler.page_table import PageTable
from minisgl.utils import cdiv


class KVManager:
    """Owns the page allocator (lesson 2's free list, over page ids) and the page table.

    Policy: a request reserves pages for its whole life (prompt + max_tokens) when it is
    admitted, so a running request can never run out of KV mid-decode and nothing ever needs
    to be preempted. Requests that do not fit yet simply wait.

    Invariant: ``allocator.num_free`` + the pages listed in occupied rows == ``num_pages``.
    """

    def __init__(self, num_pages: int, page_size: int, max_running: int, max_seq_len: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.allocator = BlockAllocator(num_pages)
        self.page_table = PageTable(max_running, cdiv(max_seq_len, page_size), page_size)

    def pages_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.page_size)

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
