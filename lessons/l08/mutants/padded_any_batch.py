"""padded() leaves out the check that the batch is a decode batch.

Breaks "a batch that is not decode: ``ValueError``": a prefill batch is padded as if each of its
rows had one new token, and the result describes a batch that never existed.
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_for_and_padding_by_hand

import torch

from minisgl.attention.metadata import BatchMetadata


def padded(self, batch_size, scratch_page):
    extra = batch_size - self.batch_size
    if extra < 0:
        raise ValueError(f"cannot pad a batch of {self.batch_size} rows to {batch_size}")
    i32 = torch.int32
    steps = torch.arange(1, extra + 1, dtype=i32)
    return BatchMetadata(
        torch.arange(batch_size + 1, dtype=i32),
        torch.cat([self.kv_indptr, self.kv_indptr[-1] + steps]),
        torch.cat([self.kv_indices, torch.full((extra,), scratch_page, dtype=i32)]),
        torch.cat([self.kv_last_page_len, torch.ones(extra, dtype=i32)]),
        self.page_size,
    )
