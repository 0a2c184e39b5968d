"""bucket_for() searches the buckets from the largest down, so the first one that holds the rows is the largest.

Breaks "the smallest bucket": every decode batch is padded to ``max_bs`` rows (a batch of 1
computes 13 rows with ``cuda_graph_max_bs=13``).
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_for_and_padding_by_hand


def bucket_for(self, num_rows):
    return next(b for b in reversed(self.buckets) if b >= num_rows)
