"""Lesson 7 exercise: the lagged loop (launch N+1, then process N) and freeing KV exactly once.

Write the four functions below, then run ``pytest lessons/l07 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

They are :class:`minisgl.scheduler.overlap.OverlapLoop`'s methods (the scheduler's loop seam).
The rest of the class is the package's and you call it:

* ``self.in_flight``: a ``deque`` of ``(batch, future)`` launched and not processed yet;
* ``self._launch(sched, batch, finished) -> bool``: books the batch, launches it on the engine
  and appends it to ``in_flight``; if launching raises, its requests fail (appended to
  ``finished``) and it returns ``False``;
* ``self._complete(sched, batch, future) -> list[Req]``: waits for the batch's tokens and
  processes them (``sched.process``); returns the requests that finished. It does not touch
  ``in_flight``: take the entry off yourself first (``self.in_flight.popleft()``, oldest first).

And the scheduler's: ``sched.has_work``,
``sched.stalled_error()`` (the exception to raise when there is work but nothing can run),
``sched.kv.release_request(req, cache=...)`` (frees a request's row and pages; must run once).

Per request (``minisgl.core.Req``): ``pending`` (tokens sampled on the device, not processed
yet), ``inflight`` (launched batches not processed yet that hold it), ``release_deferred``
(``None``, or the ``cache`` flag of a release that waits for those batches), ``status``
(a :class:`~minisgl.core.ReqStatus`: ``WAITING``, ``RUNNING`` or ``FINISHED``; a request that
ended for any reason, aborted and failed included, is ``FINISHED``).
"""

from __future__ import annotations

from minisgl.core import Batch, Req, ReqStatus  # noqa: F401  (ReqStatus: for your row_done)
from minisgl.scheduler.overlap import OverlapLoop
from minisgl.scheduler.scheduler import Scheduler


def step(self: OverlapLoop, sched: Scheduler, batch: Batch | None) -> list[Req]:
    """Launch the batch just scheduled, *then* process the batches launched before it.

    ``batch`` is what ``sched.schedule()`` picked for this step (``Scheduler.step`` asks it
    before calling you), or ``None`` if nothing could be scheduled.

    1. Note whether anything was in flight before this step.
    2. If ``batch`` is not ``None``, launch it with ``self._launch``.
    3. Complete (``self._complete``, oldest first) every batch in ``in_flight`` except the one
       just launched (if the launch succeeded, keep one; else keep none).
    4. Nothing scheduled (``batch`` is ``None``; a batch whose launch failed counts as
       scheduled), nothing was in flight before this step, and ``sched.has_work``: raise
       ``sched.stalled_error()``.

    Return every request that finished in this step (from a failed launch and from completed
    batches). The order matters: launching before completing is what lets the device run batch
    N+1 while the host processes batch N.
    """
    raise NotImplementedError("exercise l07 step(): write OverlapLoop.step in lessons/l07/exercise.py")


def flush(self: OverlapLoop, sched: Scheduler) -> list[Req]:
    """Complete every batch still in flight, oldest first; return the requests they finished."""
    raise NotImplementedError("exercise l07 flush(): write OverlapLoop.flush in lessons/l07/exercise.py")


def row_done(self: OverlapLoop, sched: Scheduler, req: Req, samples: bool) -> None:
    """``req``'s row of a launched batch is done (processed, or its batch failed).

    One batch fewer holds the request (``inflight``); if the row sampled, its token is no longer
    pending (``samples`` is a bool: ``True`` counts as 1). If the request is finished, no batch
    holds it any more and a release was deferred, do that release now (``cache`` = the deferred
    flag) and clear ``release_deferred``. "Finished" is ``req.status is ReqStatus.FINISHED``;
    "no batch holds it" is ``inflight == 0`` after your decrement.
    """
    raise NotImplementedError("exercise l07 row_done(): write OverlapLoop.row_done in lessons/l07/exercise.py")


def release(self: OverlapLoop, sched: Scheduler, req: Req, cache: bool) -> None:
    """Free ``req``'s KV (the scheduler calls this once, when the request ends).

    If a launched batch still uses the request (``inflight > 0``), its pages must not be freed
    yet (the device may still write them, and freeing now lets another request take them):
    remember ``cache`` in ``release_deferred`` instead; ``row_done`` will do it. Otherwise
    release now.
    """
    raise NotImplementedError("exercise l07 release(): write OverlapLoop.release in lessons/l07/exercise.py")
