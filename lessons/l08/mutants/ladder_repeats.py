"""bucket_sizes() concatenates the ladder and ``max_bs`` without removing the repeat when ``max_bs`` is on the ladder.

Breaks "ascending, without repeats": 16 -> [1, 2, 4, 8, 16, 16], and the runner captures the
same bucket twice.
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_ladder


def bucket_sizes(max_bs):
    if max_bs < 1:
        raise ValueError(f"max_bs must be at least 1, got {max_bs}")
    ladder = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    return ladder + [max_bs]
