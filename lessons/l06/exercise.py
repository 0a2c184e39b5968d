"""Lesson 6 exercise: fill one step's token budget (chunked prefill).

Write the function below, then run ``pytest lessons/l06 --mine``: the lesson's tests run with
your function in place of the package's (``--mine`` swaps exactly this; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

:func:`next_batch` is :class:`minisgl.scheduler.chunked.ChunkedPrefill`'s method (lesson 4's
``WholePrompts.next_batch``, rewritten for a token budget). Everything it calls is the
package's: ``sched.make_room_for_decode()`` (the running requests that decode this step;
under KV pressure it may retract some), ``sched.admit(req, others, budget)`` (reserve KV for the
head of the queue; ``False`` and no change if it cannot run now) and
``sched.build_batch(reqs, num_new)`` (flattens the first ``num_new[i]`` uncached tokens of
each request; a row that stops short of the request's end writes KV and samples nothing).
"""

from __future__ import annotations

from minisgl.core import Batch, Req  # noqa: F401  (Req: for your type hints)
from minisgl.scheduler.chunked import ChunkedPrefill
from minisgl.scheduler.scheduler import Scheduler


def next_batch(self: ChunkedPrefill, sched: Scheduler) -> Batch | None:
    """One batch of about ``self.budget`` tokens, or ``None`` if there is nothing to run.

    Fill it in this order, each request's tokens counted against the budget:

    1. one token for every decoding request (``sched.make_room_for_decode()`` returns
       that list), always, even past the budget;
    2. new requests from ``sched.waiting`` (a deque; its head is ``sched.waiting[0]``), first
       come first served, while budget is left and fewer than ``sched.config.max_running`` run
       (``len(sched.running)``): ``sched.admit(req, others, budget_left)`` with ``others`` =
       the requests already mid-prefill plus those admitted this step (``admit`` refuses a
       whole prompt that does not fit while another prompt is mid-prefill, so at most one
       prompt at a time is chunked); on ``False`` stop. On ``True``, ``admit`` has already
       popped the request off ``sched.waiting`` and appended it to ``sched.running``: do
       neither yourself. An admitted request gets ``min(uncached tokens, budget left)`` tokens
       (``req.seq_len - req.num_cached`` are uncached, after ``admit`` set ``num_cached``);
    3. the next chunk of the requests that were already mid-prefill, with whatever budget is
       left (a request that would get 0 tokens is left out of the batch). Mid-prefill means in
       ``sched.running`` and ``not req.decoding``: compute that list after step 1 (which may
       retract requests) and *before* admitting (admitted requests join ``sched.running``).

    Return ``sched.build_batch(reqs, chunks)`` with the requests in that order and their token
    counts (``chunks[i]`` tokens for ``reqs[i]``: 1 for a decoding row), or ``None`` if no
    request got a token.
    """
    raise NotImplementedError("exercise l06 next_batch(): write ChunkedPrefill.next_batch in lessons/l06/exercise.py")
