"""router_forward() picks the top-k logits first and takes the softmax over those k only.

Breaks "the softmax runs over all E experts before the top-k": the k weights always sum to 1, the
renormalised answer, so a checkpoint without ``norm_topk_prob`` gets weights that are too large.
"""
# first: lessons/l11/test_l11_model.py::test_router_picks_the_top_k_of_a_float32_softmax

import torch
import torch.nn.functional as F


def router_forward(self, x):
    top, ids = F.linear(x, self.weight).topk(self.top_k, dim=-1)
    weights = torch.softmax(top, dim=-1, dtype=torch.float32)
    if self.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), ids
