"""Lesson 10 exercise: the stop-string hold-back.

Write the two functions below, then run ``pytest lessons/l10 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

They are :class:`minisgl.detokenizer.StopStringFilter`'s methods. The server's tokenizer worker
runs them in a child process of the server: ``--mine`` makes the same swap in every child
Python of the test run (the ``MINISGL_EXERCISES`` environment variable, read at start-up), so the
server tests judge your code too (an exception in your code there stops the server: the test
then reports a 503, not your traceback; run the quick test named in the README first). The
filter's state (set by the package's ``__init__``):

* ``self.stops``: the stop strings (empty ones already dropped);
* ``self.held``: text seen but not returned yet, because it could still become a stop string;
* ``self.stopped``: a stop string appeared; the stream is over.

Invariant: ``held`` is the longest tail of the text seen so far that is a *proper prefix* of some
stop string; everything before it has been returned. The package's ``flush`` returns ``held``
when the stream ends without a stop string.
"""

from __future__ import annotations

from minisgl.detokenizer import StopStringFilter


def partial_match_len(self: StopStringFilter, text: str) -> int:
    """Length of the longest tail of ``text`` that some stop string *begins with* (0 if none).

    Example with ``stops = ["sat"]``: ``"The cat s" -> 1``, ``"The cat sa" -> 2``,
    ``"The cat" -> 0``. Only tails shorter than the longest stop string need checking (a whole
    stop string is found by ``feed`` itself). ``self.stops`` is not empty when this is called.
    """
    raise NotImplementedError("exercise l10 partial_match_len(): write StopStringFilter._partial_match_len "
                              "in lessons/l10/exercise.py")


def feed(self: StopStringFilter, text: str) -> str:
    """Add ``text`` (the next piece of the detokenized stream); return what may be shown now.

    * Once ``stopped``, return ``""`` for ever.
    * Look at ``buffer = held + text``. No stop strings at all: return all of it (``held``
      stays ``""``).
    * If some stop string occurs in it, the stream ends: set ``stopped``, clear ``held`` and
      return the text before the *earliest* occurrence of any stop string (the smallest
      ``buffer.find(stop)`` that is not -1, over all stops).
    * Otherwise keep back the tail that could still grow into a stop string, measured with
      ``self._partial_match_len(buffer)`` (call it through ``self``: a test swaps in a
      subclass's version to show what goes wrong without the hold-back): that tail becomes the
      new ``self.held`` (``""`` when the length is 0: mind that ``buffer[-0:]`` is the whole
      buffer, so slice at ``len(buffer) - k``), and the rest before it is returned.

    Example, ``stops = ["sat"]``: feeding ``"The cat s"``, ``"at on the m"``, ``"at."`` returns
    ``"The cat "``, ``""``, ``""``, and ``stopped`` is then True.
    """
    raise NotImplementedError("exercise l10 feed(): write StopStringFilter.feed in lessons/l10/exercise.py")
