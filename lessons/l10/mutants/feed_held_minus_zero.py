"""feed() keeps ``buffer[-keep:]`` as the held tail, which is the whole buffer when ``keep`` is 0.

Breaks "everything before ``held`` has been returned, once": text with no partial stop string
is returned *and* held, so the client gets it twice (again with the next piece, or at the end).
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def feed(self, text):
    if self.stopped:
        return ""
    buffer = self.held + text
    if not self.stops:
        self.held = ""
        return buffer
    hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
    if hits:
        self.stopped, self.held = True, ""
        return buffer[: min(hits)]
    keep = self._partial_match_len(buffer)
    self.held = buffer[-keep:]
    return buffer[: len(buffer) - keep]
