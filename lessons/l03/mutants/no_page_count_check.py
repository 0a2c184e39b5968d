"""from_requests() does not check that a request owns enough pages for its tokens.

Breaks "a request that owns too few pages is a ValueError": the metadata silently describes
fewer pages than the tokens need, and the new K/V are written into another request's page.
"""
# first: lessons/l03/test_l03_paged.py::test_from_requests_rejects_bad_input

from collections.abc import Sequence

import torch

from minisgl.attention.metadata import BatchMetadata
from minisgl.utils import cdiv


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
        used = cdiv(seq_len, page_size)
        indices.extend(pages[:used])  # BUG: no check that len(pages) >= used
        qo_indptr.append(qo_indptr[-1] + new)
        kv_indptr.append(kv_indptr[-1] + min(used, len(pages)))
        last.append(seq_len - (used - 1) * page_size)
    i32 = torch.int32
    return cls(
        torch.tensor(qo_indptr, dtype=i32), torch.tensor(kv_indptr, dtype=i32),
        torch.tensor(indices, dtype=i32), torch.tensor(last, dtype=i32), page_size,
    )
