"""attend_row() attends over every slot of the row's pages, not just the first ``seq_len``.

Breaks "keep the first seq_len positions (the rest of the last page is stale)": the stale tail
of a partly filled last page joins the attention.
"""
# first: lessons/l03/test_l03_paged.py::test_reference_equals_dense_on_a_ragged_mixed_batch

import torch

from minisgl.attention.dense import dense_causal_attention
from minisgl.attention.paged import ReferencePagedBackend


def attend_row(self: ReferencePagedBackend, i: int, q: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    pool = self.pool
    H, D = pool.num_kv_heads, pool.head_dim
    q0, q1 = self._qo[i], self._qo[i + 1]
    pages = self._pages[self._kv[i]:self._kv[i + 1]]
    k_i = pool.k[layer_id][pages].reshape(-1, H, D)  # BUG: no [:seq_len]
    v_i = pool.v[layer_id][pages].reshape(-1, H, D)
    num_new = q1 - q0
    out[q0:q1] = dense_causal_attention(q[q0:q1], k_i, v_i, num_cached=k_i.shape[0] - num_new)
