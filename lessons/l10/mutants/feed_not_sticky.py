"""feed() leaves out the ``stopped`` check at its top: after a stop string, later text is filtered again as if nothing happened.

Breaks "once ``stopped``, return ``""`` for ever": text generated after the stop string (tokens
already on their way when it appeared) reaches the client.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def feed(self, text):
    buffer = self.held + text
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
