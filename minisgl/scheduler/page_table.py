"""Lesson 4: the page table, one row of page ids per running request.

The page table is one int32 tensor ``[max_running, max_pages_per_req]``: row ``r`` lists the
pages of the request that occupies row ``r``, in position order. Building a batch's attention
metadata is then a vectorised gather over rows instead of a Python walk over block tables.
"""

from __future__ import annotations

__lesson__ = 4

import itertools
from collections.abc import Sequence

import torch

from minisgl.attention.metadata import BatchMetadata
from minisgl.utils import cdiv

# Batches of at most this many rows gather their pages row by row (a slice each, one join):
# on the CPU that is about 4 us for one row against about 22 for the masked gather's four
# operations, and a bs=1 decode step builds its metadata on the host before every replay.
FEW_ROWS = 8


class PageTable:
    """``table[row, i]`` = physical page holding positions ``i*page_size .. (i+1)*page_size-1``."""

    def __init__(self, max_rows: int, max_pages_per_row: int, page_size: int) -> None:
        self.page_size = page_size
        self.table = torch.zeros(max_rows, max_pages_per_row, dtype=torch.int32)
        # Pages owned per row, as Python ints: the scheduler asks for one row's count every step
        # for every decoding request, and reading a tensor element costs microseconds (lesson 7).
        self._row_pages = [0] * max_rows
        self._free_rows = list(range(max_rows - 1, -1, -1))

    @property
    def num_pages(self) -> torch.Tensor:
        """``[max_rows]`` int32: pages owned by each row (0 for a free row)."""
        return torch.tensor(self._row_pages, dtype=torch.int32)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free page-table row (too many running requests)")
        return self._free_rows.pop()

    def pages_in_row(self, row: int) -> int:
        """How many pages ``row`` owns (a plain int, no tensor access)."""
        return self._row_pages[row]

    def free_row(self, row: int) -> None:
        self._row_pages[row] = 0
        self._free_rows.append(row)

    def append_pages(self, row: int, pages: Sequence[int]) -> None:
        n = self._row_pages[row]
        if n + len(pages) > self.table.shape[1]:
            raise ValueError("request exceeds max_pages_per_row")
        self.table[row, n:n + len(pages)] = torch.tensor(list(pages), dtype=torch.int32)
        self._row_pages[row] = n + len(pages)

    def replace_pages(self, row: int, pages: Sequence[int]) -> None:
        """Point the first ``len(pages)`` entries of ``row`` at ``pages`` instead (lesson 5: a
        request's own copy of a prefix is swapped for the radix tree's identical pages)."""
        if len(pages) > self._row_pages[row]:
            raise ValueError("replace_pages can only replace pages the row already has")
        self.table[row, : len(pages)] = torch.tensor(list(pages), dtype=torch.int32)

    def truncate(self, row: int, num_pages: int) -> list[int]:
        """Keep the first ``num_pages`` pages of ``row``; return the pages dropped from its end
        (lesson 12 gives back the pages of draft tokens the target rejected)."""
        n = self._row_pages[row]
        if not 0 <= num_pages <= n:
            raise ValueError(f"row {row} has {n} pages; cannot keep {num_pages}")
        dropped = self.table[row, num_pages:n].tolist()
        self._row_pages[row] = num_pages
        return dropped

    def pages(self, row: int) -> list[int]:
        return self.table[row, : self._row_pages[row]].tolist()

    def metadata(self, rows: Sequence[int], num_cached: Sequence[int], num_new: Sequence[int]) -> BatchMetadata:
        """Vectorised :meth:`BatchMetadata.from_requests` for requests living in ``rows``."""
        if not rows or not (len(rows) == len(num_cached) == len(num_new)):
            raise ValueError("need one cached length and new-token count per row (at least one row)")
        ps = self.page_size
        # The per-row numbers in plain Python: a batch's lists are short, and each tensor op on
        # the CPU has a fixed cost of microseconds (this runs on the host before every step).
        seq = [c + n for c, n in zip(num_cached, num_new)]
        used = [cdiv(s, ps) for s in seq]  # pages each row's attention reads
        if any(u > self._row_pages[r] for r, u in zip(rows, used)):
            raise ValueError("a request in the batch owns fewer pages than its length needs")
        qo_indptr = torch.tensor([0, *itertools.accumulate(num_new)], dtype=torch.int32)
        kv_indptr = torch.tensor([0, *itertools.accumulate(used)], dtype=torch.int32)
        if len(rows) <= FEW_ROWS:  # each row's pages as a slice, joined: no mask to build
            kv_indices = torch.cat([self.table[r, :u] for r, u in zip(rows, used)])
        else:  # one masked gather over all the rows
            width = max(used)
            mask = torch.arange(width)[None, :] < kv_indptr.diff()[:, None]  # [B, width]
            kv_indices = self.table[torch.tensor(list(rows)), :width][mask]  # row-major: request by request, in order
        last = torch.tensor([s - (u - 1) * ps for s, u in zip(seq, used)], dtype=torch.int32)
        return BatchMetadata(qo_indptr, kv_indptr, kv_indices.contiguous(), last, ps)
