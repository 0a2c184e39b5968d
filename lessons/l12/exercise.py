"""Lesson 12 exercise: the acceptance rules, and the KV rollback.

Write the four functions below, then run ``pytest lessons/l12 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these, in their modules
and in every module that imported them by name, the lesson's tests included; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual. The
tensor-parallel test runs the engine in rank processes and the server test in a server process;
``--mine`` makes the same swap there.

A verify step (``minisgl/engine/verify.py``) ran a speculating row ``L d1 .. dk'`` (the last
known token, then ``k'`` drafts) through the target model once and has its logits at every
position: ``y_j``, the target's next token after the row's first ``j + 1`` inputs, judges draft
``d_{j+1}``; if every draft is accepted, ``y_k'`` is a free extra token (the *bonus*).

* :func:`accept_greedy` and :func:`greedy_tokens` are the greedy rule (``verify.py``): how many
  drafts the target accepts, and the tokens the row adds. The engine's tokens must equal
  Hugging Face's, and each step must add its accepted drafts plus one.
* :func:`accept_sampled` is the sampling rule (temperature > 0) for a proposer that guesses
  with certainty (the n-gram one): the tokens it emits must be distributed exactly as the
  target's, position by position (a chi-square test checks it).
* :func:`release_unverified_pages` is the rollback (``minisgl/scheduler/speculative.py``): after
  the step, the pages that hold nothing but rejected drafts' KV go back to the free list. After
  every step of the engine tests, a decoding request must own exactly the pages of its verified
  tokens.

For a quick loop: ``pytest lessons/l12/test_l12_verify.py --mine`` (the rules), then
``pytest lessons/l12/test_l12_engine.py --mine`` (parity and pages), and
``python lessons/l12/smoke.py --mine`` prints your tokens beside HF's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minisgl.core import Req
from minisgl.scheduler.kv_manager import KVManager, PageOwner  # noqa: F401  (KVManager: lesson 4's manager)


def accept_greedy(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading ``drafts`` the target accepts, greedily.

    ``targets[j]`` is the target's argmax after the row's first ``j + 1`` inputs (the last known
    token, then ``drafts[0 .. j-1]``), so it is what the target would have produced where
    ``drafts[j]`` stands: ``drafts[j]`` is accepted when it equals ``targets[j]`` *and* every
    draft before it was accepted (``targets[j]`` was computed as if they were right).
    ``len(targets) == len(drafts) + 1``; the answer is between 0 and ``len(drafts)``.

    Example: ``targets = [5, 6, 7, 8]``: drafts ``[5, 6, 7]`` -> 3, ``[5, 9, 7]`` -> 1 (the 7 is
    not judged: it follows a wrong token), ``[4, 6, 7]`` -> 0.
    """
    raise NotImplementedError("exercise l12 accept_greedy(): write accept_greedy in lessons/l12/exercise.py")


def greedy_tokens(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a greedy speculating row adds (``drafts``, ``targets`` as in
    :func:`accept_greedy`): its ``a = accept_greedy(drafts, targets)`` accepted drafts, then the
    target's own token at the first rejected position, ``targets[a]``; when every draft was
    accepted that is ``targets[len(drafts)]``, the bonus token. Always ``a + 1`` tokens.

    Example: ``targets = [5, 6, 7, 8]``: drafts ``[5, 6, 7]`` -> ``[5, 6, 7, 8]``, ``[5, 9, 7]``
    -> ``[5, 6]``, ``[4, 6, 7]`` -> ``[5]`` (a plain decode step's token); no drafts and
    ``targets = [5]`` -> ``[5]``.
    """
    raise NotImplementedError("exercise l12 greedy_tokens(): write greedy_tokens in lessons/l12/exercise.py")


def accept_sampled(probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None = None) -> list[int]:
    """The tokens a sampling speculating row adds.

    ``probs [k' + 1, V]`` float32: row ``j`` is the target's distribution after the row's first
    ``j + 1`` inputs, as lesson 4's sampler would draw from it (temperature, top-k, top-p
    applied); ``drafts``: the ``k'`` draft tokens, each proposed with certainty (``q`` is a point
    mass on the draft).

    For ``j = 0, 1, ...``: draw ``u`` uniform in [0, 1) and accept draft ``d = drafts[j]`` if
    ``u < p_j(d)`` (with probability ``p_j(d)``: the general ``min(1, p(d) / q(d))`` with
    ``q(d) = 1``). The first draft rejected is replaced by a draw from ``p_j`` with ``d`` removed,
    renormalised (the general ``max(0, p - q)``), and ends the row: the drafts after it are not
    judged. If none is rejected, add a bonus token drawn from ``p_k'`` (the last row). So the
    answer is the accepted drafts, then one drawn token: between 1 and ``k' + 1`` tokens, each
    distributed exactly as the target's token at its position.

    Every draw (``torch.rand``, ``torch.multinomial``) takes ``generator=generator``: the
    request's own seeded generator, which makes a seeded request reproducible (None: torch's
    global one). ``torch.multinomial`` renormalises the weights it is given; they must not be
    negative.
    """
    raise NotImplementedError("exercise l12 accept_sampled(): write accept_sampled in lessons/l12/exercise.py")


def release_unverified_pages(kv: PageOwner, req: Req) -> None:
    """After a verify step: give ``req``'s pages that hold nothing but rejected drafts' KV back
    to the free list, as if it had decoded one token at a time.

    ``req.num_cached`` counts the request's verified KV positions (``0 .. num_cached - 1``); its
    last token (position ``num_cached``) has no KV yet, as after a plain decode step. The row of
    ``req`` in ``kv.page_table`` (``req.table_row``) may hold more pages than those positions
    need: the drafts' positions got pages too. Keep the pages the verified positions need
    (``kv.pages_needed(n)``: pages for ``n`` tokens), and never fewer than the row's first
    ``req.num_tree_pages`` pages, which belong to the radix tree and not to the request. Drop the
    rest from the end of the row (``kv.page_table.truncate(row, keep)`` returns the pages it
    dropped) and free them (``kv.allocator.free(pages)``).

    Lesson 4's :class:`KVManager` reserved each request's whole life at admission: there the
    pages stay reserved (nothing to do; only ``num_cached`` moved). Lesson 5's cache manager
    takes pages on demand: there the rollback runs.
    """
    raise NotImplementedError(
        "exercise l12 release_unverified_pages(): write release_unverified_pages in lessons/l12/exercise.py")
