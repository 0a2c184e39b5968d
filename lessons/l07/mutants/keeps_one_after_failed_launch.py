"""Always keeps one batch in flight (``keep = 1``), also when nothing was launched or the launch failed.

Breaks "process the batches launched before": with nothing new launched, the last batch in
flight is never processed, its requests never finish and the scheduler spins.
"""


def step(self, sched, batch):
    finished = []
    had_previous = bool(self.in_flight)
    if batch is not None:
        self._launch(sched, batch, finished)
    keep = 1
    while len(self.in_flight) > keep:
        finished += self._complete(sched, *self.in_flight.popleft())
    if batch is None and not had_previous and sched.has_work:
        raise sched.stalled_error()
    return finished
