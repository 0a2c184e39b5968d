"""padded() keeps the real rows' ``qo_indptr`` as it is, extending only the three KV arrays.

Breaks "each extra row has one new token": the padded batch says it has the real rows' tokens
only, and its rows no longer agree with its KV arrays.
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_for_and_padding_by_hand

import torch

from minisgl.attention.metadata import BatchMetadata


def padded(self, batch_size, scratch_page):
    extra = batch_size - self.batch_size
    if extra < 0:
        raise ValueError(f"cannot pad a batch of {self.batch_size} rows to {batch_size}")
    if not self.is_decode:
        raise ValueError("only decode batches (one new token per row) are padded")
    i32 = torch.int32
    steps = torch.arange(1, extra + 1, dtype=i32)
    return BatchMetadata(
        self.qo_indptr,
        torch.cat([self.kv_indptr, self.kv_indptr[-1] + steps]),
        torch.cat([self.kv_indices, torch.full((extra,), scratch_page, dtype=i32)]),
        torch.cat([self.kv_last_page_len, torch.ones(extra, dtype=i32)]),
        self.page_size,
    )
