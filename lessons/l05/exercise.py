"""Lesson 5 exercise: the radix cache's match, insert and evict.

Write the three functions below, then run ``pytest lessons/l05 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

They are :class:`minisgl.kvcache.radix_cache.RadixCache`'s methods. Read that module's
docstring first: the invariants (page-aligned keys, children keyed by their first page, one
owner per page, reference counts, page counts, no stale nodes) are what the tests check.

The rest of the class is the package's, and you use its helpers:

* ``self.page_size``, ``self.root`` (a :class:`RadixNode`: ``key``, ``pages``, ``parent``,
  ``children`` dict from a child's first page ``key[:page_size]`` to the child, ``ref``,
  ``last_access``, ``evicted``, ``is_leaf``);
* ``self._common_pages(key, tokens, start)``: how many whole pages at the start of ``key`` equal
  ``tokens[start:]``;
* ``self._split(node, num_pages)``: cut ``node`` after its first ``num_pages`` pages; returns the
  new upper node (``node`` stays the lower part);
* ``self._touch(path)``: mark a root-to-node path (a list of nodes, root excluded) as used now;
  call it once per match/insert with the nodes you passed (an empty path is fine). It also gives
  the path's last node a fresh heap entry if it is an evictable leaf, so ``insert`` need not
  push its new leaf itself;
* ``self._owned`` (a set of every page id in the tree), ``self._evictable_pages``,
  ``self._num_nodes``: keep them up to date when you add or remove a node;
* eviction candidates: ``self._heap`` holds ``(last_access, push_number, leaf)`` entries; pop
  with ``heapq.heappop``; ``self._is_current(stamp, node)`` (``stamp`` is the entry's
  ``last_access``) says whether an entry is still valid (stale entries are skipped);
  ``self._push_if_evictable(node)`` adds a node that may have just become an evictable leaf (it
  ignores the root, a referenced node and a node with children, so call it without checking).
* ``_as_key(token_ids)``: the tokens as a tuple of ints (hashable). Convert ``token_ids`` with
  it first: ``children`` lookups and ``_common_pages`` need the tuple.

A new node is ``RadixNode(key=..., pages=[...], parent=...)`` (``children``, ``ref``,
``last_access`` and ``evicted`` have defaults).
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop  # noqa: F401  (for your evict)

from minisgl.kvcache.radix_cache import MatchResult, RadixCache, RadixNode, _as_key  # noqa: F401


def match_prefix(self: RadixCache, token_ids: Sequence[int]) -> MatchResult:
    """The longest cached prefix of ``token_ids``, in whole pages.

    Walk down from the root one child at a time (a child is found by the next ``page_size``
    tokens). A partial last page never matches (page size 4: 6 tokens match at most 4). If the
    match ends *inside* a node (only its first pages agree), split that node at the page
    boundary so that the result's node covers exactly the matched tokens.

    Returns ``MatchResult(node, pages, num_tokens)``: the deepest node of the match (the root if
    nothing matched), the matched pages in position order, and ``num_tokens == len(pages) *
    page_size``. Every node on the path becomes the most recently used (``self._touch``).
    """
    raise NotImplementedError("exercise l05 match_prefix(): write RadixCache.match_prefix in lessons/l05/exercise.py")


def insert(self: RadixCache, token_ids: Sequence[int], pages: Sequence[int]) -> int:
    """Cache ``token_ids`` held in ``pages``; return ``k``, how many leading tokens were already
    in the tree (a multiple of ``page_size``).

    * ``len(token_ids)`` must be ``len(pages) * page_size``, else ``ValueError`` (message
      containing ``"page-aligned"``).
    * Walk down like ``match_prefix``. Where the new tokens branch off *inside* a node, split it
      (only if there is something left to add after the common part).
    * The rest (``token_ids[k:]``, ``pages[k // page_size:]``) becomes one new leaf under the
      last node reached; the tree takes ownership of exactly those pages. Before adding,
      ``ValueError`` if they repeat (message containing ``"repeat"``) or are already in the tree
      (``self._owned``; message containing ``"already owned"``); then nothing is added.
      ``lessons/l05/test_l05_tree.py`` checks these messages. Nothing left to add: no new node.
      Update ``_owned``, ``_evictable_pages`` (a new leaf has ``ref == 0``) and ``_num_nodes``.
    * ``pages[:k // page_size]`` stay the caller's business (it frees the duplicates).
    * Touch the path (including the new leaf) once.
    """
    raise NotImplementedError("exercise l05 insert(): write RadixCache.insert in lessons/l05/exercise.py")


def evict(self: RadixCache, num_pages: int | float) -> list[int]:
    """Free at least ``num_pages`` pages if possible; return the freed page ids.

    ``num_pages < 0``: ``ValueError``. Pop the least recently used entries from ``self._heap``;
    skip stale ones (``self._is_current``). Remove each valid leaf whole: unlink it from its
    parent's ``children``, set its ``parent`` to ``None`` and ``evicted`` to ``True``, take its
    pages out of ``_owned`` and the counts (``_evictable_pages``, ``_num_nodes``). Its parent may
    now be an unreferenced leaf itself: offer it with ``self._push_if_evictable(parent)``.
    Stop once enough pages are freed or the heap is empty. ``num_pages`` may be ``float("inf")``.
    """
    raise NotImplementedError("exercise l05 evict(): write RadixCache.evict in lessons/l05/exercise.py")
