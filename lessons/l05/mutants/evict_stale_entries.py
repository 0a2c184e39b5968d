"""evict() trusts every heap entry: it never asks self._is_current whether the entry is still valid.

Breaks "locked nodes are never evicted" and LRU order: a node locked, touched or given a child
since its entry was pushed is evicted anyway (a running request's prefix pages are freed).
"""
# first: lessons/l05/test_l05_tree.py::test_lock_protects_from_eviction

from heapq import heappop

from minisgl.kvcache.radix_cache import RadixCache


def evict(self: RadixCache, num_pages: int | float) -> list[int]:
    if num_pages < 0:
        raise ValueError(f"cannot evict a negative number of pages ({num_pages})")
    freed: list[int] = []
    while len(freed) < num_pages and self._heap:
        _, _, node = heappop(self._heap)
        if node.evicted:  # BUG: a locked, touched or non-leaf node passes
            continue
        parent = node.parent
        del parent.children[node.key[: self.page_size]]
        node.parent, node.evicted = None, True
        freed.extend(node.pages)
        self._owned.difference_update(node.pages)
        self._evictable_pages -= len(node.pages)
        self._num_nodes -= 1
        self._push_if_evictable(parent)
    return freed
