"""bucket_sizes() leaves out the check of ``max_bs < 1``.

Breaks "``max_bs < 1`` raises ``ValueError``": bucket_sizes(0) returns [0], a graph for batches of
no rows.
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_ladder


def bucket_sizes(max_bs):
    ladder = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    return sorted(set(ladder) | {max_bs})
