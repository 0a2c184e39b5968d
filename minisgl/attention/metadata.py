"""Lesson 3: batch metadata in the standard ragged/paged (CSR) form that FlashInfer uses.

For a batch of ``B`` requests whose new tokens are flattened into one stream of ``T`` tokens:

* ``qo_indptr [B+1]``: request ``i``'s new tokens are ``q[qo_indptr[i]:qo_indptr[i+1]]``;
* ``kv_indptr [B+1]``, ``kv_indices``: request ``i``'s pages are
  ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``, in position order;
* ``kv_last_page_len [B]``: tokens used in each request's last page (``1 .. page_size``).

KV lengths *include* the new tokens (their K/V are appended before attention runs), so
``seq_len[i] = (num_pages[i] - 1) * page_size + kv_last_page_len[i]`` and request ``i`` has
``seq_len[i] - qo_len[i]`` cached tokens. All tensors are int32 and live on the CPU; backends
copy what they need to the device once per batch (plan once, run per layer).
"""

from __future__ import annotations

__lesson__ = 3

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minisgl.utils import cdiv


@dataclass(frozen=True)
class BatchMetadata:
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [kv_indptr[-1]] int32, page ids
    kv_last_page_len: torch.Tensor  # [B] int32
    page_size: int

    @property
    def batch_size(self) -> int:
        return self.qo_indptr.numel() - 1

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr[-1])

    @property
    def qo_lens(self) -> torch.Tensor:
        return self.qo_indptr.diff()

    @property
    def seq_lens(self) -> torch.Tensor:
        """``[B]`` KV length of each request after this forward (cached + new)."""
        num_pages = self.kv_indptr.diff()
        return (num_pages - 1) * self.page_size + self.kv_last_page_len

    @property
    def is_decode(self) -> bool:
        """Every request brings exactly one new token (a decode batch)."""
        return bool((self.qo_lens == 1).all())

    @classmethod
    def from_requests(
        cls, page_lists: Sequence[Sequence[int]], num_cached: Sequence[int], num_new: Sequence[int], page_size: int
    ) -> BatchMetadata:
        """Build from each request's pages, cached length and new-token count.

        A request may own more pages than it needs yet (reserved ahead); only the first
        ``ceil((cached + new) / page_size)`` are described.
        """
        if not (len(page_lists) == len(num_cached) == len(num_new)) or not page_lists:
            raise ValueError("need one page list, cached length and new-token count per request (at least one)")
        qo_indptr, kv_indptr, indices, last = [0], [0], [], []
        for pages, cached, new in zip(page_lists, num_cached, num_new):
            if new < 1:
                raise ValueError("every request in a batch must bring at least one new token")
            seq_len = cached + new
            used = cdiv(seq_len, page_size)
            if used > len(pages):
                raise ValueError(f"request needs {used} pages for {seq_len} tokens but owns {len(pages)}")
            indices.extend(pages[:used])
            qo_indptr.append(qo_indptr[-1] + new)
            kv_indptr.append(kv_indptr[-1] + used)
            last.append(seq_len - (used - 1) * page_size)
        i32 = torch.int32
        return cls(
            torch.tensor(qo_indptr, dtype=i32), torch.tensor(kv_indptr, dtype=i32),
            torch.tensor(indices, dtype=i32), torch.tensor(last, dtype=i32), page_size,
        )

    def padded(self, batch_size: int, scratch_page: int) -> BatchMetadata:
        """Lesson 8: this decode batch padded to ``batch_size`` rows. Each padded row has one
        new token and a history of one token, in ``scratch_page`` (a page no request owns)."""
        extra = batch_size - self.batch_size
        if extra < 0:
            raise ValueError(f"cannot pad a batch of {self.batch_size} rows to {batch_size}")
        if not self.is_decode:
            raise ValueError("only decode batches (one new token per row) are padded")
        if extra == 0:  # already the bucket's size: itself (frozen, so safely shared), no new tensors
            return self
        i32 = torch.int32
        steps = torch.arange(1, extra + 1, dtype=i32)
        return BatchMetadata(
            torch.arange(batch_size + 1, dtype=i32),
            torch.cat([self.kv_indptr, self.kv_indptr[-1] + steps]),
            torch.cat([self.kv_indices, torch.full((extra,), scratch_page, dtype=i32)]),
            torch.cat([self.kv_last_page_len, torch.ones(extra, dtype=i32)]),
            self.page_size,
        )

    def new_token_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(batch_index [T], position [T])`` int64: which request and which sequence position
        each flattened new token belongs to."""
        qo_lens = self.qo_lens.long()
        batch = torch.repeat_interleave(torch.arange(self.batch_size), qo_lens)
        start_of_req = self.qo_indptr[:-1].long()[batch]
        cached = (self.seq_lens.long() - qo_lens)[batch]
        positions = cached + torch.arange(self.num_tokens) - start_of_req
        return batch, positions

    def new_token_slots(self) -> torch.Tensor:
        """``[T]`` int64 slot (``page * page_size + offset``) where each new token's K/V go."""
        batch, positions = self.new_token_positions()
        page_idx = self.kv_indptr[:-1].long()[batch] + positions // self.page_size
        return self.kv_indices.long()[page_idx] * self.page_size + positions % self.page_size
