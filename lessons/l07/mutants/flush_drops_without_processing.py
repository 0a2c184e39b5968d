"""Flushes by clearing ``in_flight`` without completing the batches in it.

Breaks "free KV exactly once": a finished request whose release waits for a batch still in
flight is never released, so its pages leak.
"""
# first: lessons/l07/test_l07_overlap.py::test_flush_processes_the_batch_still_in_flight


def flush(self, sched):
    finished = []
    self.in_flight.clear()
    return finished
