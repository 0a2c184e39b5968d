"""bucket_for() picks the largest bucket not above ``num_rows`` (rounds down instead of up).

Breaks "a bucket that holds ``num_rows`` rows": a batch of 3 runs in the graph of 2, and its
last row is never computed.
"""
# first: lessons/l08/test_l08_graphs.py::test_bucket_for_and_padding_by_hand


def bucket_for(self, num_rows):
    return max(b for b in self.buckets if b <= num_rows)
