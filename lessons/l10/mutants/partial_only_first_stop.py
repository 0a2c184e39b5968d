"""_partial_match_len() checks the tails against the first stop string only (``self.stops[0]``).

Breaks the hold-back with several stop strings: the beginning of any other one is let out, so
that stop string, split across two pieces, is never seen.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def partial_match_len(self, text):
    longest = len(self.stops[0]) - 1
    for n in range(min(longest, len(text)), 0, -1):
        tail = text[-n:]
        if self.stops[0].startswith(tail):
            return n
    return 0
