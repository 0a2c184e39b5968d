"""accept_greedy() counts the first draft that differs from the target as accepted too (an off-by-one).

Breaks "a draft is accepted only if it equals the target's token": the row emits a token the
target did not choose, and every request's tokens part from Hugging Face's there.
"""
# first: lessons/l12/test_l12_verify.py::test_greedy_accepts_the_matching_prefix_then_adds_the_targets_token


def accept_greedy(drafts, targets):
    for j, draft in enumerate(drafts):
        if draft != targets[j]:
            return j + 1
    return len(drafts)
