"""Completes every batch in flight but never takes them off ``in_flight``.

Breaks flush: the loop still says it is busy afterwards, and the same batches are processed
again at the next step.
"""
# first: lessons/l07/test_l07_overlap.py::test_flush_processes_the_batch_still_in_flight


def flush(self, sched):
    finished = []
    for batch, future in self.in_flight:
        finished += self._complete(sched, batch, future)
    return finished
