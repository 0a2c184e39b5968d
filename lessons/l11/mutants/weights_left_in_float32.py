"""router_forward() returns the weights in float32, the softmax's dtype, not in ``x``'s.

Breaks "the weights come back in x's dtype": a bf16 model's experts get float32 weights and
their weighted outputs come out in float32 (a float32 model cannot show it).
"""
# first: lessons/l11/test_l11_model.py::test_router_picks_the_float32_top_k_of_a_bf16_model

import torch
import torch.nn.functional as F


def router_forward(self, x):
    probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(self.top_k, dim=-1)
    if self.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
