"""bucket_for() uses ``bisect_right`` (the first bucket *above* ``num_rows``) where ``bisect_left`` was meant.

Breaks "the smallest bucket that holds ``num_rows`` rows": a batch of exactly 4 rows runs in the
bucket of 8, and a batch of ``max_bs`` rows finds no bucket at all (IndexError).
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_for_and_padding_by_hand

import bisect


def bucket_for(self, num_rows):
    return self.buckets[bisect.bisect_right(self.buckets, num_rows)]
