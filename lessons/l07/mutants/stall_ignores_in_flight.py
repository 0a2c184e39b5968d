"""Raises the stall error whenever nothing was scheduled and there is work, forgetting the batch in flight.

Breaks every run's end: when the only work left is the batch in flight (its requests' last
tokens pending), the scheduler raises "stalled" instead of processing it.
"""
# first: lessons/l07/test_l07_overlap.py::test_tight_pool_retracts_under_overlap_and_stays_identical


def step(self, sched, batch):
    finished = []
    launched = batch is not None and self._launch(sched, batch, finished)
    keep = 1 if launched else 0
    while len(self.in_flight) > keep:
        finished += self._complete(sched, *self.in_flight.popleft())
    if batch is None and sched.has_work:
        raise sched.stalled_error()
    return finished
