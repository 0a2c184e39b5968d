"""Completes the batches in flight first and launches the new batch after them (the synchronous order).

Breaks the overlap: the device sits idle while the host processes batch N, because batch N+1
is launched only afterwards; never are two batches in flight.
"""
# first: lessons/l07/test_l07_overlap.py::test_overlap_on_off_and_hf_give_the_same_tokens


def step(self, sched, batch):
    finished = []
    had_previous = bool(self.in_flight)
    while self.in_flight:
        finished += self._complete(sched, *self.in_flight.popleft())
    if batch is not None:
        self._launch(sched, batch, finished)
    if batch is None and not had_previous and sched.has_work:
        raise sched.stalled_error()
    return finished
