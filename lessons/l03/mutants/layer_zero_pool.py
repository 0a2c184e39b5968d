"""attend_row() reads the K/V of layer 0 for every layer (pool.k[0]).

Breaks the model from its second layer on: every layer attends over the first layer's keys
and values (a one-layer check cannot see it; the model's tokens can).
"""
# first: lessons/l03/test_l03_paged.py::test_greedy_tokens_identical_to_hf

import torch

from minisgl.attention.dense import dense_causal_attention
from minisgl.attention.paged import ReferencePagedBackend


def attend_row(self: ReferencePagedBackend, i: int, q: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    pool = self.pool
    H, D = pool.num_kv_heads, pool.head_dim
    seq_len = self._seq_lens[i]
    q0, q1 = self._qo[i], self._qo[i + 1]
    pages = self._pages[self._kv[i]:self._kv[i + 1]]
    k_i = pool.k[0][pages].reshape(-1, H, D)[:seq_len]  # BUG: layer 0
    v_i = pool.v[0][pages].reshape(-1, H, D)[:seq_len]
    out[q0:q1] = dense_causal_attention(q[q0:q1], k_i, v_i, num_cached=seq_len - (q1 - q0))
