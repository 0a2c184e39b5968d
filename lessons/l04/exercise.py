"""Lesson 4 exercise: admission and batch building, the heart of continuous batching.

Write the two functions below, then run ``pytest lessons/l04 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

* :func:`next_batch` is :class:`minisgl.scheduler.scheduler.WholePrompts`'s method: what runs
  this step (admit-and-prefill if anything fits, else decode everyone).
* :func:`build_batch` is :class:`minisgl.scheduler.scheduler.Scheduler`'s ``build_batch``: the
  chosen requests' next tokens, flattened into one :class:`minisgl.core.Batch`.

The pieces you call are the package's: ``sched.admit`` (reserve KV for the head of the queue),
``sched.make_room_for_decode``, ``sched.kv.page_table.metadata``, ``sched.loop.input_ids``
and ``sched.loop.batch_built``. Read ``minisgl/core.py`` (``Req``, ``Batch``) first.
"""

from __future__ import annotations

import torch  # noqa: F401  (for your build_batch)

from minisgl.core import Batch, Req
from minisgl.scheduler.scheduler import Scheduler, WholePrompts


def next_batch(self: WholePrompts, sched: Scheduler) -> Batch | None:
    """The next batch, or ``None`` if nothing can run.

    1. Admission, first come first served: while ``sched.waiting`` is not empty and fewer than
       ``sched.config.max_running`` requests run (``len(sched.running)``), look at the head ``sched.waiting[0]`` and try
       ``sched.admit(req, admitted, budget)``; ``admitted`` are the requests admitted so far this
       step and ``budget`` starts at ``self.max_prefill_tokens``. ``admit`` moves the request from
       ``waiting`` to ``running`` and sets ``req.num_cached`` (0 here; lesson 5's cache may
       serve a prefix) or returns ``False`` and changes nothing: then stop (nobody overtakes
       the head of the queue). Each admitted request spends ``req.seq_len - req.num_cached``
       (its uncached tokens) of the budget, which may go below 0. A request whose ``seq_len``
       exceeds what is left of the budget is not even tried once another one is admitted: stop
       before calling ``admit`` (a long prompt may go alone, as the first one of the step).
    2. If anything was admitted: a prefill batch of exactly those requests
       (``sched.build_batch(admitted)``).
    3. Otherwise a decode batch of ``sched.make_room_for_decode()`` (the running requests
       that want a token), or ``None`` if that is empty.
    """
    raise NotImplementedError("exercise l04 next_batch(): write WholePrompts.next_batch in lessons/l04/exercise.py")


def build_batch(self: Scheduler, reqs: list[Req], num_new: list[int] | None = None) -> Batch:
    """Flatten the next tokens of ``reqs`` (the scheduler is ``self``) into one ``Batch``.

    For each request ``req`` (row ``i``):

    * its new tokens are ``self.loop.input_ids(req)`` (its uncached tokens), cut to the first
      ``num_new[i]`` when ``num_new`` is given (lesson 6's chunks);
    * their positions are ``req.num_cached, req.num_cached + 1, ...``;
    * ``extend_lens[i]`` is how many there are;
    * the row *samples* (chooses a token) only if it reaches the end of what is known:
      ``req.num_cached + len(new) == req.seq_len``.

    Then:

    * ``meta = self.kv.page_table.metadata(rows, num_cached, extend_lens)`` with each request's
      ``table_row`` and ``num_cached``;
    * ``logits_indices [S]`` (int64): the index, in the flattened stream, of the *last* new token
      of every sampling row (row ends are ``cumsum(extend_lens) - 1``);
    * ``decode_rows[i] = req.decoding``, computed *before* anything else (and passed to
      ``Batch``); ``mode`` is ``"decode"`` if every row decodes, ``"mixed"`` if some do,
      ``"prefill"`` if none does;
    * ``Batch(mode, reqs, extend_lens, input_ids [T] int64, positions [T] int64, logits_indices,
      meta, samples, decode_rows=decode_rows)`` (``samples``: a list of bools, one per row; every
      tensor on the CPU: the engine makes the device copies); call
      ``self.loop.batch_built(batch)`` on it and return it.

    Two classic bugs the tests inject: positions counted from 0 in the flattened stream instead
    of per request, and the logits of each row's *first* token instead of its last.
    """
    raise NotImplementedError("exercise l04 build_batch(): write Scheduler.build_batch in lessons/l04/exercise.py")
