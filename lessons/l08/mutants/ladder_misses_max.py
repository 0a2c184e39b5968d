"""bucket_sizes() stops at the last multiple of 8 and forgets ``max_bs`` itself when it is not on the ladder.

Breaks "``max_bs`` itself even when it is not on that ladder": with ``cuda_graph_max_bs=13`` the
largest batches get no graph (13 -> [1, 2, 4, 8]).
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_ladder


def bucket_sizes(max_bs):
    if max_bs < 1:
        raise ValueError(f"max_bs must be at least 1, got {max_bs}")
    ladder = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    return sorted(set(ladder))
