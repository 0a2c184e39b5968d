"""accept_sampled() trusts the proposer: every draft is accepted, then a bonus token is drawn.

Breaks "each emitted token is distributed as the target's": a draft of probability 0.25 is
emitted every time (the chi-square test of the first position fails).
"""
# first: lessons/l12/test_l12_verify.py::test_speculative_sampling_keeps_the_target_distribution

import torch


def accept_sampled(probs, drafts, generator=None):
    out = [int(d) for d in drafts]
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out
