"""router_forward() ignores ``self.renormalize`` and always returns the raw top-k probabilities.

Breaks checkpoints with ``norm_topk_prob`` on (Qwen3-MoE's): each token's k weights must be
rescaled to sum to 1, and every MoE layer's output comes out too small.
"""
# first: lessons/l11/test_l11_model.py::test_router_picks_the_top_k_of_a_float32_softmax

import torch
import torch.nn.functional as F


def router_forward(self, x):
    probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(self.top_k, dim=-1)
    return weights.to(x.dtype), ids
