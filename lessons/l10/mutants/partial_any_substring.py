"""_partial_match_len() holds back a tail that occurs *anywhere* in a stop string (``tail in s``), not only at its start.

Breaks "hold back only what could still grow into a stop string": text that cannot begin a stop
string is kept from a streaming client until later text arrives.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def partial_match_len(self, text):
    longest = max(len(s) for s in self.stops) - 1
    for n in range(min(longest, len(text)), 0, -1):
        tail = text[-n:]
        if any(tail in s for s in self.stops):
            return n
    return 0
