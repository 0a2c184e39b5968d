"""Leaves out the stall check (step 4): nothing scheduled, nothing in flight, work left, and it returns quietly.

Breaks the stall error: when KV is lost and nothing can ever run, the scheduler loops forever
instead of raising ``scheduler stalled``.
"""
# first: lessons/l07/test_l07_overlap.py::test_nothing_can_run_and_nothing_in_flight_is_a_stall


def step(self, sched, batch):
    finished = []
    launched = batch is not None and self._launch(sched, batch, finished)
    keep = 1 if launched else 0
    while len(self.in_flight) > keep:
        finished += self._complete(sched, *self.in_flight.popleft())
    return finished
