"""accept_sampled() replaces a rejected draft by a draw from ``p`` itself, the rejected draft left in.

Breaks "the emitted token is distributed as ``p``": the draft comes out with probability
``p(d) + (1 - p(d)) p(d)``, too often (for the n-gram's certain guess, ``max(0, p - q)`` is ``p``
without ``d``).
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
        out.append(int(torch.multinomial(p, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out
