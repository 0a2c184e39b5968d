"""Checks ``inflight == 0`` for the deferred release before taking this batch off ``inflight``.

Breaks "free KV exactly once": the last batch holding a finished request still counts when
it is checked, so the deferred release never happens and its pages leak.
"""
# first: lessons/l07/test_l07_overlap.py::test_aborting_mid_chunk_waits_for_the_chunk_in_flight

from minisgl.core import ReqStatus


def row_done(self, sched, req, samples):
    req.pending -= samples
    if req.status == ReqStatus.FINISHED and req.inflight == 0 and req.release_deferred is not None:
        sched.kv.release_request(req, cache=req.release_deferred)
        req.release_deferred = None
    req.inflight -= 1
