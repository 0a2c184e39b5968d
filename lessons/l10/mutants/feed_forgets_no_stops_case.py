"""feed() leaves out the case of no stop strings and goes straight to the search and the hold-back.

Breaks every request without stop strings: ``_partial_match_len`` takes ``max()`` over no stop
strings and raises, so the stream fails instead of passing the text through.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def feed(self, text):
    if self.stopped:
        return ""
    buffer = self.held + text
    hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
    if hits:
        self.stopped, self.held = True, ""
        return buffer[: min(hits)]
    keep = self._partial_match_len(buffer)
    self.held = buffer[len(buffer) - keep :]
    return buffer[: len(buffer) - keep]
