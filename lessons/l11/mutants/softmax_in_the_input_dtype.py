"""router_forward() takes the softmax in the logits' own dtype (bf16 for a bf16 model), not in float32.

Breaks "softmax in float32": bf16 keeps 8 bits of mantissa, so experts whose probabilities are
close but different tie after rounding and the top-k may pick the wrong one (a float32 model
cannot show it: the lesson's CPU tests need a bf16 router).
"""
# first: lessons/l11/test_l11_model.py::test_router_picks_the_float32_top_k_of_a_bf16_model

import torch.nn.functional as F


def router_forward(self, x):
    probs = F.linear(x, self.weight).softmax(dim=-1)
    weights, ids = probs.topk(self.top_k, dim=-1)
    if self.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
