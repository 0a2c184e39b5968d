"""attend_row() passes num_cached=0 to the attention: the causal mask is aligned top-left.

Breaks attention after a cached prefix (every decode row): query j sees keys 0..j instead of
0..cached+j.
"""
# first: lessons/l03/test_l03_paged.py::test_reference_equals_dense_on_a_ragged_mixed_batch

import torch

from minisgl.attention.dense import dense_causal_attention
from minisgl.attention.paged import ReferencePagedBackend


def attend_row(self: ReferencePagedBackend, i: int, q: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    pool = self.pool
    H, D = pool.num_kv_heads, pool.head_dim
    seq_len = self._seq_lens[i]
    q0, q1 = self._qo[i], self._qo[i + 1]
    pages = self._pages[self._kv[i]:self._kv[i + 1]]
    k_i = pool.k[layer_id][pages].reshape(-1, H, D)[:seq_len]
    v_i = pool.v[layer_id][pages].reshape(-1, H, D)[:seq_len]
    out[q0:q1] = dense_causal_attention(q[q0:q1], k_i, v_i, num_cached=0)  # BUG
