"""greedy_tokens() adds the target's own token only after a rejected draft, and nothing when every draft was accepted.

Breaks "every step adds its accepted drafts plus one": the tokens stay right, but each fully
accepted step wastes its free bonus token (the lesson's break-it).
"""
# first: lessons/l12/test_l12_verify.py::test_greedy_accepts_the_matching_prefix_then_adds_the_targets_token


def greedy_tokens(drafts, targets):
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    tokens = list(drafts[:accepted])
    if accepted < len(drafts):
        tokens.append(targets[accepted])
    return tokens
