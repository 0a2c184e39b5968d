"""accept_greedy() judges draft ``j`` by ``targets[j + 1]``, the target's token *after* that draft, not the one at its place.

Breaks "``d_{j+1}`` is judged by ``y_j``": a draft is kept when it equals the token that should
follow it, so the row emits tokens the target never chose (the README's first pitfall).
"""
# first: lessons/l12/test_l12_verify.py::test_greedy_accepts_the_matching_prefix_then_adds_the_targets_token


def accept_greedy(drafts, targets):
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted + 1]:
        accepted += 1
    return accepted
