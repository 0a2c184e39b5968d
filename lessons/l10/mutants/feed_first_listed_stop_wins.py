"""feed() cuts at the first stop string *in the list* that occurs in the text, not at the earliest occurrence in the text.

Breaks "the earliest stop string wins": with ``stop=["on", "cat"]`` and ``"The cat sat on"`` the
client gets ``"The cat sat "``, a stop string ("cat") included.
"""
# first: lessons/l10/test_l10_server.py::test_the_stop_filter_piece_by_piece


def feed(self, text):
    if self.stopped:
        return ""
    buffer = self.held + text
    if not self.stops:
        self.held = ""
        return buffer
    for stop in self.stops:
        if stop in buffer:
            self.stopped, self.held = True, ""
            return buffer[: buffer.find(stop)]
    keep = self._partial_match_len(buffer)
    self.held = buffer[len(buffer) - keep :]
    return buffer[: len(buffer) - keep]
