"""Completes the batches in flight newest first (``in_flight.pop()``), not oldest first.

Breaks the order of results: the batch just launched is processed before the one before it,
so a request's tokens are appended out of order.
"""


def step(self, sched, batch):
    finished = []
    had_previous = bool(self.in_flight)
    launched = batch is not None and self._launch(sched, batch, finished)
    keep = 1 if launched else 0
    while len(self.in_flight) > keep:
        finished += self._complete(sched, *self.in_flight.pop())
    if batch is None and not had_previous and sched.has_work:
        raise sched.stalled_error()
    return finished
