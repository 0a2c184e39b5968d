"""_partial_match_len() tries the tails from the shortest up and returns the first that matches.

Breaks "the *longest* tail that is a prefix of a stop string": with a stop string that repeats
itself ("abab"), only "a" of "...aba" is held; "ab" is let out and the stop string that follows
is never seen.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def partial_match_len(self, text):
    longest = max(len(s) for s in self.stops) - 1
    for n in range(1, min(longest, len(text)) + 1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in self.stops):
            return n
    return 0
