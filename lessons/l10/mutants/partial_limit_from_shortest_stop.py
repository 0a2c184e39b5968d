"""_partial_match_len() bounds the tails by the *shortest* stop string (``min``), not the longest.

Breaks the hold-back with stop strings of different lengths: the beginning of a longer one that
is longer than the shortest stop string is let out, and that stop string is never seen.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def partial_match_len(self, text):
    longest = min(len(s) for s in self.stops) - 1
    for n in range(min(longest, len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in self.stops):
            return n
    return 0
