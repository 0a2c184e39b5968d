"""accept_sampled() draws from torch's global generator, not from the request's own ``generator``.

Breaks "a seeded request is reproducible": its tokens now depend on every other draw made in
the process (other requests, other batches), so the same seed gives different tokens.
"""
# first: lessons/l12/test_l12_seeded.py::test_accept_sampled_draws_only_from_the_given_generator

import torch


def accept_sampled(probs, drafts, generator=None):
    out = []
    for j, draft in enumerate(drafts):
        p = probs[j]
        u = torch.rand(())
        if u < p[draft]:
            out.append(int(draft))
            continue
        residual = p.clone()
        residual[draft] = 0.0
        out.append(int(torch.multinomial(residual, 1)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1)))
    return out
