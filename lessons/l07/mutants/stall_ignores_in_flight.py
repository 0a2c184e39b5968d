"""Raises the stall error whenever nothing was scheduled and there is work, forgetting the batch in flight.

Breaks the lagged loop under KV pressure: requests retracted with a token still in flight cannot
be admitted until that batch is processed, so for a step nothing can be scheduled, and the
scheduler raises "stalled" instead of processing the batch in flight.
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
