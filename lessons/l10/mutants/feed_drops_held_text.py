"""feed() looks at the new ``text`` alone, forgetting to put the ``held`` tail in front of it.

Breaks the hold-back: a held tail is never shown (the text loses characters), and a stop string
split across two pieces is never seen.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def feed(self, text):
    if self.stopped:
        return ""
    buffer = text
    if not self.stops:
        self.held = ""
        return buffer
    hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
    if hits:
        self.stopped, self.held = True, ""
        return buffer[: min(hits)]
    keep = self._partial_match_len(buffer)
    self.held = buffer[len(buffer) - keep :]
    return buffer[: len(buffer) - keep]
