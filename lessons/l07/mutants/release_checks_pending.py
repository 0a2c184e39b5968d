"""Defers the release only while the request has a token pending (``req.pending > 0``), not while a batch holds it.

Breaks "never free pages a launched batch still writes": a request aborted while a chunk of its
prompt (a row that samples nothing) is in flight is freed at once, under the running chunk.
"""
# first: lessons/l07/test_l07_overlap.py::test_aborting_mid_chunk_waits_for_the_chunk_in_flight


def release(self, sched, req, cache):
    if req.pending > 0:
        req.release_deferred = cache
    else:
        sched.kv.release_request(req, cache=cache)
