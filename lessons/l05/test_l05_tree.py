"""Lesson 5: the radix cache (prefix tree over token ids -> KV page ids), no model, no tensors.

Run: pytest lessons/l05/test_l05_tree.py   (part of pytest lessons/l05, so of --mine too)

Unit tests for each promise of :class:`RadixCache` (a match split at the page boundary where it
ends, LRU order, page-granular eviction that stops as soon as enough is freed, the "already
owned" and "repeat" checks of insert), a property test that drives it like a scheduler would
(with lesson 2's allocator holding the pages) against a naive model, and a test that eviction
does not walk the whole tree.

The naive model is a dict from every cached page-aligned prefix (a tuple of tokens) to the page
holding that prefix's last page. Matching in the model is "extend the prefix one page at a time
while it is in the dict", which is obviously right and obviously slow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.radix_cache import MatchResult, RadixCache, RadixNode
from minisgl.utils import cdiv


def check_tree(cache: RadixCache) -> None:
    """Structural invariants and the incremental counters against a recount from scratch."""
    ps = cache.page_size
    evictable = protected = nodes = 0
    owners: dict[int, RadixNode] = {}
    for node in cache.nodes():
        nodes += 1
        assert not node.evicted and node.parent is not None
        assert node.pages, "only the root may hold no page"
        assert len(node.key) == len(node.pages) * ps, "keys are page-aligned"
        assert node.parent.children[node.key[:ps]] is node, "children are keyed by their first page"
        assert node.ref >= 0 and (node.parent is cache.root or node.parent.ref >= node.ref)
        for page in node.pages:
            assert page not in owners, f"page {page} is owned by two nodes"
            owners[page] = node
        if node.ref == 0:
            evictable += len(node.pages)
        else:
            protected += len(node.pages)
    assert not cache.root.pages and cache.root.parent is None
    assert (cache.evictable_pages, cache.protected_pages) == (evictable, protected)
    assert cache.total_pages == evictable + protected == len(cache.pages())
    assert cache.num_nodes == nodes


def path_pages(cache: RadixCache, node: RadixNode) -> list[int]:
    """The pages from the root down to ``node``."""
    parts = []
    while node is not cache.root:
        parts.append(node.pages)
        node = node.parent
    return [p for pages in reversed(parts) for p in pages]


def path_tokens(cache: RadixCache, node: RadixNode) -> tuple[int, ...]:
    """The tokens from the root down to ``node`` (concatenated keys)."""
    parts = []
    while node is not cache.root:
        parts.append(node.key)
        node = node.parent
    return tuple(t for key in reversed(parts) for t in key)


# ---- unit tests ------------------------------------------------------------------------------


def test_empty_tree_matches_nothing() -> None:
    cache = RadixCache(page_size=2)
    m = cache.match_prefix([1, 2, 3, 4])
    assert (m.node, m.pages, m.num_tokens) == (cache.root, [], 0)
    assert cache.match_prefix([]).num_tokens == 0
    assert cache.total_pages == 0 and cache.evict(5) == [] and cache.pages() == []
    check_tree(cache)


def test_insert_then_match_exact_longer_shorter() -> None:
    cache = RadixCache(page_size=2)
    assert cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]) == 0
    exact = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert (exact.pages, exact.num_tokens) == ([10, 11, 12], 6)
    assert path_tokens(cache, exact.node) == (1, 2, 3, 4, 5, 6)
    longer = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    assert (longer.pages, longer.num_tokens) == ([10, 11, 12], 6)
    shorter = cache.match_prefix([1, 2, 3, 4])
    assert (shorter.pages, shorter.num_tokens) == ([10, 11], 4)
    diverging = cache.match_prefix([1, 2, 9, 9])
    assert (diverging.pages, diverging.num_tokens) == ([10], 2)
    assert cache.match_prefix([2, 1]).pages == []
    check_tree(cache)


def test_partial_last_page_never_matches() -> None:
    cache = RadixCache(page_size=4)
    cache.insert(list(range(8)), [0, 1])
    m = cache.match_prefix([0, 1, 2, 3, 4, 5])  # 6 tokens: 1 whole page + 2 tokens of the next
    assert (m.pages, m.num_tokens) == ([0], 4)
    assert cache.match_prefix([0, 1, 2]).num_tokens == 0
    cache.insert([0, 1, 2, 3, 4, 5, 9, 9], [0, 7])  # same first page, second differs in its last token
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 6, 9]).pages == [0], "a page matches only whole"
    check_tree(cache)


def test_match_splits_node_at_page_boundary() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 11, 12, 13])
    assert cache.num_nodes == 1
    m = cache.match_prefix([1, 2, 3, 4, 0, 0])
    assert (m.pages, m.num_tokens) == ([10, 11], 4)
    assert cache.num_nodes == 2, "the node was split where the match ended"
    assert m.node.key == (1, 2, 3, 4) and m.node.pages == [10, 11]
    (lower,) = m.node.children.values()
    assert lower.key == (5, 6, 7, 8) and lower.pages == [12, 13] and lower.parent is m.node
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).pages == [10, 11, 12, 13], "nothing lost"
    assert sorted(cache.pages()) == [10, 11, 12, 13]
    check_tree(cache)


def test_insert_returns_already_cached_prefix() -> None:
    cache = RadixCache(page_size=2)
    assert cache.insert([1, 2, 3, 4], [10, 11]) == 0
    assert cache.insert([1, 2, 3, 4, 5, 6], [20, 21, 22]) == 4  # takes only page 22
    assert cache.insert([1, 2, 7, 7], [30, 31]) == 2  # branches inside (1 2 3 4): split
    assert cache.insert([1, 3], [40]) == 0, "first page differs in its second token"
    assert sorted(cache.pages()) == [10, 11, 22, 31, 40]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).pages == [10, 11, 22]
    assert cache.match_prefix([1, 2, 7, 7]).pages == [10, 31]
    check_tree(cache)


def test_duplicate_insert_takes_no_pages() -> None:
    cache = RadixCache(page_size=3)
    assert cache.insert([1, 2, 3, 4, 5, 6], [10, 11]) == 0
    assert cache.insert([1, 2, 3, 4, 5, 6], [20, 21]) == 6
    assert cache.insert([1, 2, 3], [30]) == 3, "a prefix of a node is already cached: no split needed"
    assert sorted(cache.pages()) == [10, 11] and cache.num_nodes == 1
    assert cache.insert([], []) == 0
    check_tree(cache)


def test_insert_rejects_bad_arguments() -> None:
    cache = RadixCache(page_size=2)
    with pytest.raises(ValueError, match="page-aligned"):
        cache.insert([1, 2, 3], [10, 11])
    with pytest.raises(ValueError, match="page-aligned"):
        cache.insert([1, 2, 3, 4], [10])
    cache.insert([1, 2], [10])
    with pytest.raises(ValueError, match="already owned"):
        cache.insert([5, 6], [10])  # page 10 already holds (1 2)
    with pytest.raises(ValueError, match="repeat"):
        cache.insert([5, 6, 7, 8], [11, 11])
    assert cache.pages() == [10]
    with pytest.raises(ValueError):
        RadixCache(page_size=0)
    with pytest.raises(ValueError):
        cache.evict(-1)
    check_tree(cache)


def test_lock_protects_from_eviction() -> None:
    cache = RadixCache(page_size=1)
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [20, 21, 22])  # takes page 22 only
    m = cache.match_prefix([1, 2, 3])
    cache.lock(m.node)
    assert (cache.protected_pages, cache.evictable_pages) == (3, 1)
    assert cache.evict(100) == [22], "only the unlocked branch may go"
    assert cache.match_prefix([1, 2, 3]).pages == [10, 11, 12]
    cache.unlock(m.node)
    assert sorted(cache.evict(100)) == [10, 11, 12]
    check_tree(cache)


def test_unlock_mirrors_lock() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    deep = cache.match_prefix([1, 2, 3, 4, 5, 6]).node
    cache.lock(deep)
    shallow = cache.match_prefix([1, 2, 3, 4]).node  # splits the locked node: the lock must hold
    cache.lock(shallow)
    cache.lock(shallow)
    assert (shallow.ref, deep.ref) == (3, 1)
    assert (cache.protected_pages, cache.evictable_pages) == (3, 0)
    check_tree(cache)
    cache.unlock(deep)
    assert (shallow.ref, deep.ref) == (2, 0)
    assert (cache.protected_pages, cache.evictable_pages) == (2, 1)
    cache.unlock(shallow)
    cache.unlock(shallow)
    assert (shallow.ref, deep.ref) == (0, 0)
    assert (cache.protected_pages, cache.evictable_pages) == (0, 3)
    with pytest.raises(ValueError, match="without a matching lock"):
        cache.unlock(shallow)
    with pytest.raises(ValueError):
        cache.unlock(deep)
    cache.lock(cache.root)  # harmless no-ops
    cache.unlock(cache.root)
    cache.unlock(cache.root)
    assert (cache.protected_pages, cache.evictable_pages) == (0, 3)
    check_tree(cache)


def test_eviction_is_lru() -> None:
    cache = RadixCache(page_size=1)
    for first in range(4):
        cache.insert([first, 9], [2 * first, 2 * first + 1])
    cache.match_prefix([0, 9])  # 0 becomes the most recent; 1 is now the oldest
    cache.insert([2, 9], [50, 51])  # a duplicate insert is an access too: 2 is newer than 3
    assert cache.evict(1) == [2, 3]  # branch 1: one node of two pages, removed whole
    assert cache.evict(2) == [6, 7]  # branch 3
    assert cache.evict(1) == [0, 1]  # branch 0, matched before branch 2's duplicate insert
    assert cache.evict(1) == [4, 5]
    check_tree(cache)


def test_evict_leaf_then_its_parent() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 1, 2, 2], [10, 11])
    cache.insert([1, 1, 3, 3], [10, 12])  # splits: parent (1 1) with leaves (2 2) and (3 3)
    cache.match_prefix([1, 1, 2, 2])  # (3 3) is the LRU leaf, (2 2) the newest
    assert cache.evict(1) == [12]
    assert cache.evict(1) == [11], "the parent is not a leaf yet"
    assert cache.evict(1) == [10], "now the parent is an unreferenced leaf"
    assert cache.total_pages == 0 and cache.match_prefix([1, 1]).pages == []
    check_tree(cache)


def test_evict_more_than_available_returns_what_exists() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 2, 3, 4], [10, 11])
    cache.insert([5, 6], [12])
    m = cache.match_prefix([5, 6])
    cache.lock(m.node)
    assert sorted(cache.evict(10)) == [10, 11]
    assert cache.evict(10) == [] and cache.pages() == [12]
    cache.unlock(m.node)
    assert cache.reset() == [12] and cache.num_nodes == 0
    check_tree(cache)


def test_evicted_pages_are_never_matched_again() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 2, 3, 4], [10, 11])
    m = cache.match_prefix([1, 2])  # split: (1 2) -> (3 4)
    assert cache.evict(2) == [11, 10]
    assert m.node.evicted
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(m.node)
    assert cache.match_prefix([1, 2, 3, 4]).pages == []
    cache.insert([7, 8], [11])  # the allocator hands page 11 out again, now for other tokens
    assert cache.match_prefix([1, 2, 3, 4]).pages == [] and cache.match_prefix([7, 8]).pages == [11]
    check_tree(cache)


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_page_sizes(page_size: int) -> None:
    ps = page_size
    cache = RadixCache(page_size=ps)
    a = [7] * (3 * ps)
    b = [7] * ps + [8] * (2 * ps)
    assert cache.insert(a, [0, 1, 2]) == 0
    assert cache.insert(b, [0, 3, 4]) == ps
    assert cache.match_prefix(a + [1]).pages == [0, 1, 2]
    assert cache.match_prefix(b[: 3 * ps - 1]).pages == [0, 3], "the last page is one token short"
    assert cache.match_prefix([7] * (ps - 1)).num_tokens == 0
    assert cache.match_prefix([7] * ps + [8] * ps).num_tokens == 2 * ps
    assert sorted(cache.pages()) == [0, 1, 2, 3, 4]
    check_tree(cache)
    assert sorted(cache.reset()) == [0, 1, 2, 3, 4]
    check_tree(cache)


def test_heap_stays_small_under_many_touches() -> None:
    """Every match of a leaf pushes a fresh heap entry; stale ones are dropped now and then
    (``_heap`` is private: its size is the point here). Eviction still sees every leaf, in LRU order."""
    cache = RadixCache(page_size=2)
    for leaf in range(3):
        cache.insert([leaf, leaf], [leaf])
    for _ in range(1000):
        cache.match_prefix([0, 0])  # leaves 1 and 2 keep their one old entry through every cleanup
    assert len(cache._heap) <= 2 * cache.num_nodes + 64
    assert cache.evict(1) == [1] and cache.evict(1) == [2] and cache.evict(1) == [0]
    check_tree(cache)


def test_evict_does_not_scan_every_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evicting one page from a tree of 2,000 leaves looks at a handful of nodes, not all of them.

    Implementation-agnostic count: every attribute read on a RadixNode records which node it was.
    """
    cache = RadixCache(page_size=1)
    for i in range(2000):  # 40 groups of 50 leaves; leaf i holds token 1000 + i in page i
        group_page = 10**6 + i  # taken by the tree for the first leaf of a group, a duplicate after
        cache.insert([i // 50, 1000 + i], [group_page, i])
    assert cache.num_nodes == 2040
    cache.match_prefix([0, 1000])  # leaf 0 is no longer the LRU one; leaf 1 is
    seen: set[int] = set()
    read = object.__getattribute__

    def counting_getattribute(node: RadixNode, name: str) -> object:
        seen.add(id(node))
        return read(node, name)

    monkeypatch.setattr(RadixNode, "__getattribute__", counting_getattribute)
    freed = cache.evict(1)
    touched = len(seen)
    seen.clear()
    cache.pages()  # the instrument works: a full walk sees every node
    walked = len(seen)
    monkeypatch.undo()
    assert freed == [1]
    assert walked > 2000
    assert touched <= 5, f"evict(1) looked at {touched} nodes of {walked}"
    check_tree(cache)


# ---- property test against a naive model ---------------------------------------------------


@dataclass
class Request:
    tokens: list[int]
    node: RadixNode  # locked at admission
    pages: list[int]  # matched pages (the tree's), then fresh pages (the request's own)
    num_matched: int  # pages that came from the tree


ALPHABET = st.integers(0, 2)  # three token values: prefixes collide all the time


class RadixMachine(RuleBasedStateMachine):
    """Requests are admitted (match + lock + allocate), finish (insert + unlock + free duplicates)
    or abort; the allocator runs short and the scheduler evicts. The model is the dict
    ``prefix tokens -> page of that prefix's last page``; the allocator catches double frees."""

    @initialize(page_size=st.sampled_from([1, 2, 3]), num_pages=st.integers(3, 24))
    def start(self, page_size: int, num_pages: int) -> None:
        self.ps, self.num_pages = page_size, num_pages
        self.cache = RadixCache(page_size)
        self.allocator = BlockAllocator(num_pages)
        self.model: dict[tuple[int, ...], int] = {}
        self.live: list[Request] = []
        self.readers: list[MatchResult] = []  # matches held locked without pages of their own
        self.given = 0  # pages the tree took ownership of, over all inserts
        self.taken_back = 0  # pages evict returned, over all evictions
        self.seen: list[list[int]] = []  # sequences admitted or inserted: later queries reuse their prefixes

    def draw_tokens(self, data: st.DataObject, num_pages: int | None = None, remember: bool = False) -> list[int]:
        """A sequence that often extends a prefix of an earlier one (exactly ``num_pages`` pages if given)."""
        tokens: list[int] = []
        if self.seen and data.draw(st.booleans()):
            earlier = data.draw(st.sampled_from(self.seen))
            tokens = earlier[: data.draw(st.integers(0, min(len(earlier), 5 * self.ps)))]
        if num_pages is None:
            tokens += data.draw(st.lists(ALPHABET, max_size=3 * self.ps))
        else:
            tokens = tokens[: num_pages * self.ps]
            missing = num_pages * self.ps - len(tokens)
            tokens += data.draw(st.lists(ALPHABET, min_size=missing, max_size=missing))
        if remember:
            self.seen = (self.seen + [tokens])[-8:]
        return tokens

    def model_match(self, tokens: list[int]) -> list[int]:
        pages = []
        for end in range(self.ps, len(tokens) + 1, self.ps):
            page = self.model.get(tuple(tokens[:end]))
            if page is None:
                break
            pages.append(page)
        return pages

    def locked_pages(self) -> set[int]:
        return {p for req in self.live for p in req.pages[: req.num_matched]} | {
            p for m in self.readers for p in m.pages
        }

    def locked_nodes(self) -> list[RadixNode]:
        return [req.node for req in self.live] + [m.node for m in self.readers]

    def evict(self, num_pages: int) -> list[int]:
        before, locked = self.cache.evictable_pages, self.locked_pages()
        biggest_node = max((len(node.pages) for node in self.cache.nodes()), default=0)
        freed = self.cache.evict(num_pages)
        assert len(set(freed)) == len(freed)
        assert len(freed) >= num_pages if before >= num_pages else len(freed) == before
        assert len(freed) < num_pages + biggest_node or not freed, "evicted more nodes than needed"
        assert not set(freed) & locked, "a locked page was evicted"
        by_page = {page: prefix for prefix, page in self.model.items()}
        for page in freed:
            del self.model[by_page[page]]  # KeyError: the tree evicted a page it did not own
        assert all(prefix[: -self.ps] in self.model or len(prefix) == self.ps for prefix in self.model), (
            "eviction removed a page in the middle of a cached prefix"
        )
        assert all(not node.evicted for node in self.locked_nodes())
        self.taken_back += len(freed)
        self.allocator.free(freed)
        return freed

    def alloc(self, n: int) -> list[int] | None:
        if n > self.allocator.num_free:
            self.evict(n - self.allocator.num_free)
        return self.allocator.alloc(n) if n <= self.allocator.num_free else None

    def insert(self, tokens: list[int], pages: list[int]) -> int:
        expected = len(self.model_match(tokens)) * self.ps
        done = self.cache.insert(tokens, pages)
        assert done == expected
        for i in range(done // self.ps, len(pages)):
            self.model[tuple(tokens[: (i + 1) * self.ps])] = pages[i]
        self.given += len(pages) - done // self.ps
        return done

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        tokens = self.draw_tokens(data)
        m = self.cache.match_prefix(tokens)
        assert m.pages == self.model_match(tokens)
        assert m.num_tokens == len(m.pages) * self.ps
        assert path_tokens(self.cache, m.node) == tuple(tokens[: m.num_tokens])
        if data.draw(st.booleans()):
            self.cache.lock(m.node)
            self.readers.append(m)

    @precondition(lambda self: bool(self.readers))
    @rule(data=st.data())
    def unlock_reader(self, data: st.DataObject) -> None:
        m = self.readers.pop(data.draw(st.integers(0, len(self.readers) - 1)))
        assert path_pages(self.cache, m.node) == m.pages, "locked pages stay where they were"
        self.cache.unlock(m.node)

    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        tokens = self.draw_tokens(data, remember=True)
        m = self.cache.match_prefix(tokens)
        assert m.pages == self.model_match(tokens)
        self.cache.lock(m.node)
        fresh = self.alloc(cdiv(len(tokens), self.ps) - len(m.pages))
        if fresh is None:  # does not fit even after evicting: the request waits
            self.cache.unlock(m.node)
            return
        self.live.append(Request(tokens, m.node, m.pages + fresh, len(m.pages)))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        req = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        aligned = len(req.tokens) // self.ps
        done = self.insert(req.tokens[: aligned * self.ps], req.pages[:aligned])
        assert done >= req.num_matched * self.ps, "what the request matched is still cached (locked)"
        self.cache.unlock(req.node)
        self.allocator.free(req.pages[req.num_matched : done // self.ps] + req.pages[aligned:])

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        req = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self.cache.unlock(req.node)
        self.allocator.free(req.pages[req.num_matched :])

    @rule(data=st.data(), num_pages=st.integers(1, 4))
    def insert_unmatched(self, data: st.DataObject, num_pages: int) -> None:
        """Insert pages computed without looking at the cache: the already-cached part are duplicates."""
        tokens = self.draw_tokens(data, num_pages, remember=True)
        pages = self.alloc(num_pages)
        if pages is not None:
            done = self.insert(tokens, pages)
            self.allocator.free(pages[: done // self.ps])

    @rule(num_pages=st.integers(0, 6))
    def evict_some(self, num_pages: int) -> None:
        self.evict(num_pages)

    @precondition(lambda self: self.cache.total_pages >= self.num_pages // 2)  # not too often
    @rule()
    def drain(self) -> None:
        """Abort everything and evict everything: the tree ends empty and every page is free."""
        while self.live:
            req = self.live.pop()
            self.cache.unlock(req.node)
            self.allocator.free(req.pages[req.num_matched :])
        while self.readers:
            self.cache.unlock(self.readers.pop().node)
        self.evict(math.inf)
        assert self.cache.total_pages == 0 and self.cache.num_nodes == 0 and not self.model
        assert self.allocator.num_free == self.num_pages

    @invariant()
    def tree_matches_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        check_tree(self.cache)
        assert sorted(self.cache.pages()) == sorted(self.model.values())
        expected_ref: dict[int, int] = {}
        for node in self.locked_nodes():
            while node is not self.cache.root:
                expected_ref[id(node)] = expected_ref.get(id(node), 0) + 1
                node = node.parent
        for node in self.cache.nodes():
            assert node.ref == expected_ref.get(id(node), 0), "ref != locks taken at or below the node"

    @invariant()
    def pages_are_conserved(self) -> None:
        if not hasattr(self, "cache"):
            return
        tree = set(self.cache.pages())
        requests = [p for req in self.live for p in req.pages[req.num_matched :]]
        assert len(set(requests)) == len(requests) and not tree & set(requests)
        assert self.allocator.num_allocated == len(tree) + len(requests)
        assert self.given == self.cache.total_pages + self.taken_back

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            self.drain()


TestRadixCacheAgainstModel = RadixMachine.TestCase
TestRadixCacheAgainstModel.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
