"""bucket_sizes() keeps doubling past 8 (16, 32, 64, ...) instead of stepping by 8.

Breaks the ladder "every multiple of 8 from 16 up to ``max_bs``": a batch of 33 is padded to
64 rows, almost twice the work.
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_ladder


def bucket_sizes(max_bs):
    if max_bs < 1:
        raise ValueError(f"max_bs must be at least 1, got {max_bs}")
    ladder = [b for b in (1, 2, 4, 8) if b <= max_bs] + [2 ** k for k in range(4, max_bs.bit_length()) if 2 ** k <= max_bs]
    return sorted(set(ladder) | {max_bs})
