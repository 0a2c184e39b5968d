"""Always defers the release to ``row_done``, also when no batch holds the request.

Breaks "free KV exactly once": a request that ends with no batch in flight (a waiting request
aborted, one finished by the batch just processed) is never released, so its pages leak.
"""


def release(self, sched, req, cache):
    req.release_deferred = cache
