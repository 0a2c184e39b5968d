"""Lesson 5: the radix cache, a prefix tree over token ids whose values are KV page ids.

Requests that share a prompt prefix (a system prompt, a few-shot header, the earlier turns of a
chat) have identical K and V for that prefix. The radix cache keeps the pages of finished
requests, keyed by the tokens they hold, so a new request can reuse the longest cached prefix
instead of computing it again.

It is a pure data structure over ints: it holds page *ids* (no tensors) and knows nothing about
requests, the scheduler or the allocator. When it evicts pages it returns their ids and the
caller frees them.

The tree with ``page_size = 2`` after caching ``a b c d e f``, ``a b c d g h i j`` and ``x y``
(each node holds a run of whole pages; its key is the tokens of those pages)::

    root
     +-- (a b c d) -> pages [7, 3]
     |     +-- (e f) -> [9]
     |     +-- (g h i j) -> [2, 5]
     +-- (x y) -> [4]

Invariants (checked by ``lessons/l05/test_l05_tree.py``):

* **page-aligned keys**: a node's key holds exactly ``len(node.pages) * page_size`` tokens and
  ``node.pages[i]`` holds the K/V of ``node.key[i*page_size : (i+1)*page_size]``. Every node but
  the root has at least one page. A partial page is never cached.
* **children are keyed by their first page**: ``parent.children[child.key[:page_size]] is child``,
  so siblings differ within their first page and a lookup needs one dict access per node.
* **one owner per page**: every page id in the tree belongs to exactly one node. The root owns no
  page and is never evicted.
* **reference counts**: ``node.ref`` == the number of outstanding :meth:`RadixCache.lock` calls
  taken at ``node`` or anywhere below it. Hence ``ref(parent) >= ref(child)``, and the subtree of
  a node with ``ref == 0`` is entirely unreferenced, so it can be evicted leaf by leaf.
* **page counts**: ``evictable_pages`` (pages in nodes with ``ref == 0``) + ``protected_pages``
  (pages in nodes with ``ref > 0``) == ``total_pages``; both are kept up to date on every change.
* **no stale nodes**: an evicted node is unlinked from its parent, so no later match can reach it
  or return its pages.
"""

from __future__ import annotations

__lesson__ = 5

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from minisgl.utils import require_int


@dataclass(eq=False)  # eq=False: nodes compare and hash by identity
class RadixNode:
    """One run of whole pages in the tree (see the module docstring for the invariants)."""

    key: tuple[int, ...]  # the tokens held by this node's pages, len(pages) * page_size of them
    pages: list[int]  # page ids, in position order
    parent: RadixNode | None  # None for the root and for evicted nodes
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)  # first page -> child
    ref: int = 0  # locks taken at this node or below it
    last_access: int = 0  # value of the cache's clock when a match or insert last passed here
    evicted: bool = False

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass
class MatchResult:
    """The longest cached prefix of a query.

    ``node`` is the deepest node of the match (the root if nothing matched): pass it to
    :meth:`RadixCache.lock` and later :meth:`RadixCache.unlock`. ``pages`` hold the matched tokens
    in position order, and ``num_tokens == len(pages) * page_size``.
    """

    node: RadixNode
    pages: list[int]
    num_tokens: int


class RadixCache:
    """Prefix cache from page-aligned token sequences to the KV pages that hold them.

    Usage by a scheduler (it owns the allocator; the cache only moves page ids around)::

        m = cache.match_prefix(prompt[:-1])   # reuse m.pages, compute the rest
        cache.lock(m.node)                    # the matched pages must not be evicted meanwhile
        ...                                   # the request runs on m.pages + fresh pages
        done = cache.insert(aligned_tokens, all_pages[:num_aligned_pages])
        allocator.free(all_pages[m.num_tokens // ps : done // ps])   # duplicates
        cache.unlock(m.node)
        allocator.free(cache.evict(n))        # when the allocator runs short

    Eviction picks the least recently used unreferenced leaf from a heap keyed by
    ``last_access``. Entries are invalidated lazily: a popped entry whose node was touched since,
    got a child, got locked or was evicted is skipped. Each entry is popped at most once, so the
    work is ``O(log n)`` per pushed entry, never a scan of the whole tree.
    """

    def __init__(self, page_size: int) -> None:
        require_int("RadixCache", "page_size", page_size)
        self.page_size = page_size
        self.root = RadixNode(key=(), pages=[], parent=None)
        self._clock = 0  # logical time for LRU: +1 per match or insert (deterministic, unlike wall time)
        self._heap: list[tuple[int, int, RadixNode]] = []  # (last_access, push number, leaf)
        self._num_pushes = 0  # tie-breaker, so the heap never compares two nodes
        self._owned: set[int] = set()  # every page id in the tree
        self._evictable_pages = 0
        self._protected_pages = 0
        self._num_nodes = 0  # excluding the root

    # ---- sizes -----------------------------------------------------------------------------

    @property
    def evictable_pages(self) -> int:
        """Pages in nodes with ``ref == 0``: what :meth:`evict` could free, cascading up leaf by leaf."""
        return self._evictable_pages

    @property
    def protected_pages(self) -> int:
        """Pages in nodes with ``ref > 0``: in use by a locked request, never evicted."""
        return self._protected_pages

    @property
    def total_pages(self) -> int:
        return self._evictable_pages + self._protected_pages

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, not counting the root."""
        return self._num_nodes

    def nodes(self) -> Iterator[RadixNode]:
        """Every node except the root, parents before children (a full walk: for tests and debugging)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def pages(self) -> list[int]:
        """Every page id the tree owns, found by walking the tree (for accounting checks)."""
        return [page for node in self.nodes() for page in node.pages]

    # ---- lookup and insertion --------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        """The longest cached prefix of ``token_ids``, in whole pages.

        A partial last page never matches (page_size 4: 6 tokens match at most 4). If the match
        ends inside a node, that node is split at the page boundary so that ``result.node`` covers
        exactly the matched tokens. Every node on the path becomes the most recently used.
        """
        tokens = _as_key(token_ids)
        ps = self.page_size
        node, pos, pages, path = self.root, 0, [], []
        while len(tokens) - pos >= ps:
            child = node.children.get(tokens[pos : pos + ps])
            if child is None:
                break
            num_same = self._common_pages(child.key, tokens, pos)
            ends_inside = num_same < len(child.pages)
            if ends_inside:
                child = self._split(child, num_same)
            pages.extend(child.pages)
            pos += len(child.key)
            node = child
            path.append(child)
            if ends_inside:
                break
        self._touch(path)
        return MatchResult(node=node, pages=pages, num_tokens=pos)

    def insert(self, token_ids: Sequence[int], pages: Sequence[int]) -> int:
        """Cache ``token_ids`` (page-aligned) held in ``pages``; return how many were already cached.

        ``len(token_ids)`` must equal ``len(pages) * page_size`` (``ValueError`` otherwise). The
        return value ``k`` is the number of leading tokens that were already in the tree, a
        multiple of ``page_size``. The tree takes ownership of ``pages[k // page_size:]`` only.
        ``pages[:k // page_size]`` stay the caller's business: those that are not the tree's own
        pages are duplicates the caller must free. Example: a request matched ``m`` tokens when it
        was admitted and now finishes; ``pages[:m // ps]`` are the tree's (do not free),
        ``pages[m // ps : k // ps]`` were computed again meanwhile (free them).

        Raises ``ValueError`` if a page the tree would take is already in the tree or repeats;
        then nothing is added (a node may have been split, which changes nothing that is cached).
        """
        tokens = _as_key(token_ids)
        ps = self.page_size
        if len(tokens) != len(pages) * ps:
            raise ValueError(
                f"insert needs page-aligned tokens: {len(tokens)} tokens for {len(pages)} pages of {ps}"
            )
        node, pos, path = self.root, 0, []
        while pos < len(tokens):
            child = node.children.get(tokens[pos : pos + ps])
            if child is None:
                break
            num_same = self._common_pages(child.key, tokens, pos)
            if num_same < len(child.pages) and pos + num_same * ps < len(tokens):
                child = self._split(child, num_same)  # the new tokens branch off inside child
            pos += num_same * ps  # all of child's pages, or the query ended inside child
            node = child
            path.append(child)
        already_cached = pos
        if pos < len(tokens):
            new_pages = [int(p) for p in pages[pos // ps :]]
            if len(set(new_pages)) != len(new_pages) or not self._owned.isdisjoint(new_pages):
                raise ValueError(f"insert: pages {new_pages} repeat or are already owned by the tree")
            leaf = RadixNode(key=tokens[pos:], pages=new_pages, parent=node)
            node.children[leaf.key[:ps]] = leaf
            self._owned.update(new_pages)
            self._evictable_pages += len(new_pages)
            self._num_nodes += 1
            path.append(leaf)
        self._touch(path)
        return already_cached

    # ---- locking ---------------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and all its ancestors from eviction (``ref += 1`` up to the root)."""
        if node.evicted:
            raise ValueError("cannot lock an evicted node")
        while node is not self.root:
            if node.ref == 0:
                self._evictable_pages -= len(node.pages)
                self._protected_pages += len(node.pages)
            node.ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one :meth:`lock` of ``node`` (``ref -= 1`` up to the root). ``ValueError`` if not locked."""
        if node is self.root:
            return
        if node.ref == 0:  # ref(ancestor) >= ref(node), so checking the node itself is enough
            raise ValueError("unlock without a matching lock")
        while node is not self.root:
            node.ref -= 1
            if node.ref == 0:
                self._protected_pages -= len(node.pages)
                self._evictable_pages += len(node.pages)
                self._push_if_evictable(node)
            node = node.parent

    # ---- eviction --------------------------------------------------------------------------

    def evict(self, num_pages: int | float) -> list[int]:
        """Free at least ``num_pages`` pages if possible; return the ids of the freed pages.

        Removes least-recently-used unreferenced leaves one at a time; a parent left as an
        unreferenced leaf becomes a candidate too. Stops as soon as ``num_pages`` pages are freed
        (a node is removed whole, so a little more may come back) or nothing is evictable
        (then everything with ``ref == 0`` is gone). The caller gives the pages to the allocator.
        """
        if num_pages < 0:
            raise ValueError(f"cannot evict a negative number of pages ({num_pages})")
        freed: list[int] = []
        while len(freed) < num_pages and self._heap:
            stamp, _, node = heappop(self._heap)
            if not self._is_current(stamp, node):
                continue  # stale entry: touched, locked, grew a child or already evicted since
            parent = node.parent
            del parent.children[node.key[: self.page_size]]
            node.parent, node.evicted = None, True
            freed.extend(node.pages)
            self._owned.difference_update(node.pages)
            self._evictable_pages -= len(node.pages)
            self._num_nodes -= 1
            self._push_if_evictable(parent)
        return freed

    def reset(self) -> list[int]:
        """Evict every unreferenced node; return their pages. With nothing locked the tree is empty after."""
        return self.evict(self._evictable_pages)

    # ---- internals -------------------------------------------------------------------------

    def _common_pages(self, key: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
        """How many whole pages at the start of ``key`` equal ``tokens[start:]``."""
        limit = min(len(key), len(tokens) - start)
        same = 0
        while same < limit and key[same] == tokens[start + same]:
            same += 1
        return same // self.page_size

    def _split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut ``node`` after its first ``num_pages`` pages (``0 < num_pages < len(node.pages)``).

        Returns the new upper part, inserted between ``node`` and its parent. ``node`` keeps its
        identity as the lower part, so locks and MatchResults that point at it stay valid. Both
        parts carry ``node.ref`` (the locks at or below the lower part are below the upper part
        too), so the page counts do not change; neither do the heap entries (``node`` is a leaf
        exactly when it was one before).
        """
        cut = num_pages * self.page_size
        upper = RadixNode(
            key=node.key[:cut],
            pages=node.pages[:num_pages],
            parent=node.parent,
            ref=node.ref,
            last_access=node.last_access,
        )
        node.parent.children[upper.key[: self.page_size]] = upper  # same first page as node had
        node.key, node.pages, node.parent = node.key[cut:], node.pages[num_pages:], upper
        upper.children[node.key[: self.page_size]] = node
        self._num_nodes += 1
        return upper

    def _touch(self, path: list[RadixNode]) -> None:
        """Mark the nodes of one root-to-node path as used now (one clock tick per operation).

        All nodes of the path get the same stamp, so a parent is never older than its children.
        Only the last node of a path can be a leaf, so only it may need a fresh heap entry.
        """
        if not path:
            return
        self._clock += 1
        for node in path:
            node.last_access = self._clock
        self._push_if_evictable(path[-1])

    def _is_current(self, stamp: int, node: RadixNode) -> bool:
        """Whether a heap entry still describes an evictable leaf at its latest access time."""
        return not node.evicted and node.ref == 0 and node.is_leaf and node.last_access == stamp

    def _push_if_evictable(self, node: RadixNode) -> None:
        if node is self.root or node.ref > 0 or not node.is_leaf:
            return
        heappush(self._heap, (node.last_access, self._num_pushes, node))
        self._num_pushes += 1
        if len(self._heap) > 2 * self._num_nodes + 64:
            self._compact_heap()

    def _compact_heap(self) -> None:
        """Drop stale entries so the heap stays ``O(nodes)``. Costs ``O(heap)``, paid for by the
        ``> nodes`` pushes since the last compaction."""
        current: dict[int, tuple[int, int, RadixNode]] = {}  # one entry per node (id -> entry)
        for entry in self._heap:
            stamp, _, node = entry
            if self._is_current(stamp, node):
                current[id(node)] = entry
        self._heap = list(current.values())
        heapify(self._heap)


def _as_key(token_ids: Sequence[int]) -> tuple[int, ...]:
    """Token ids as a tuple of plain ints, so keys hash and compare by value (numpy/torch scalars too)."""
    return tuple(map(int, token_ids))
