"""router_forward() rescales the k weights to sum to 1 whether or not ``self.renormalize`` asks for it.

Breaks checkpoints with ``norm_topk_prob`` off (Qwen2-MoE's, the sparse-step one): their experts'
outputs are weighted by the raw top-k probabilities, which sum to less than 1.
"""
# first: lessons/l11/test_l11_model.py::test_router_picks_the_top_k_of_a_float32_softmax

import torch
import torch.nn.functional as F


def router_forward(self, x):
    probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(self.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), ids
