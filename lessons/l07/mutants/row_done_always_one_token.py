"""Takes one token off ``pending`` for every row, also for a row that did not sample (a non-final chunk).

Breaks the pending count: after a chunk, a request counts -1 pending tokens, so its next input
is taken for a token still on the device.
"""

from minisgl.core import ReqStatus


def row_done(self, sched, req, samples):
    req.pending -= 1
    req.inflight -= 1
    if req.status == ReqStatus.FINISHED and req.inflight == 0 and req.release_deferred is not None:
        sched.kv.release_request(req, cache=req.release_deferred)
        req.release_deferred = None
