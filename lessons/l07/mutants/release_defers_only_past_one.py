"""Defers the release only when more than one batch holds the request (``inflight > 1``).

Breaks "never free pages a launched batch still writes": a request that ends while one batch
in flight still holds it is freed at once.
"""
# first: lessons/l07/test_l07_overlap.py::test_aborting_mid_chunk_waits_for_the_chunk_in_flight


def release(self, sched, req, cache):
    if req.inflight > 1:
        req.release_deferred = cache
    else:
        sched.kv.release_request(req, cache=cache)
