"""from_requests() counts a request's pages as seq_len // page_size (floor) instead of the ceiling.

Breaks "ceil(seq_len / page_size) pages each": a partly filled last page is left out, so its
tokens are never attended to.
"""
# first: lessons/l03/test_l03_paged.py::test_readme_worked_example

from collections.abc import Sequence

import torch

from minisgl.attention.metadata import BatchMetadata


def from_requests(
    cls: type[BatchMetadata], page_lists: Sequence[Sequence[int]], num_cached: Sequence[int],
    num_new: Sequence[int], page_size: int,
) -> BatchMetadata:
    if not (len(page_lists) == len(num_cached) == len(num_new)) or not page_lists:
        raise ValueError("need one page list, cached length and new-token count per request (at least one)")
    qo_indptr, kv_indptr, indices, last = [0], [0], [], []
    for pages, cached, new in zip(page_lists, num_cached, num_new):
        if new < 1:
            raise ValueError("every request in a batch must bring at least one new token")
        seq_len = cached + new
        used = max(1, seq_len // page_size)  # BUG: floor
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
