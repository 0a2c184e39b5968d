"""feed() returns the text up to and including the stop string.

Breaks "return the text before the earliest occurrence": the client sees the stop string, which
the OpenAI API leaves out.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def feed(self, text):
    if self.stopped:
        return ""
    buffer = self.held + text
    if not self.stops:
        self.held = ""
        return buffer
    hits = [(i, len(s)) for i, s in ((buffer.find(s), s) for s in self.stops) if i >= 0]
    if hits:
        self.stopped, self.held = True, ""
        i, n = min(hits)
        return buffer[: i + n]
    keep = self._partial_match_len(buffer)
    self.held = buffer[len(buffer) - keep :]
    return buffer[: len(buffer) - keep]
