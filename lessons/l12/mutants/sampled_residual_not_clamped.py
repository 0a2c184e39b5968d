"""accept_sampled() draws the replacement from ``p - q`` (``q`` the one-hot draft) without clamping it at zero.

Breaks the residual of the general rule, ``max(0, p - q)``: the draft's weight is ``p(d) - 1 < 0``
and ``torch.multinomial`` refuses a negative weight, so every rejection raises.
"""
# first: lessons/l12/test_l12_verify.py::test_speculative_sampling_keeps_the_target_distribution

import torch


def accept_sampled(probs, drafts, generator=None):
    out = []
    for j, draft in enumerate(drafts):
        p = probs[j]
        u = torch.rand((), generator=generator, device=p.device)
        if u < p[draft]:
            out.append(int(draft))
            continue
        residual = p - torch.nn.functional.one_hot(torch.tensor(draft), p.numel()).to(p.dtype)
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out
