"""evict() stops once it has freed num_pages * page_size pages: it counts the request in tokens.

Breaks page-granular eviction: with pages of 16 tokens, asking for 1 page throws away 16
pages' worth of cached prefixes.
"""
# first: lessons/l05/test_l05_tree.py::test_evict_leaf_then_its_parent

from heapq import heappop

from minisgl.kvcache.radix_cache import RadixCache


def evict(self: RadixCache, num_pages: int | float) -> list[int]:
    if num_pages < 0:
        raise ValueError(f"cannot evict a negative number of pages ({num_pages})")
    freed: list[int] = []
    while len(freed) < num_pages * self.page_size and self._heap:  # BUG: tokens, not pages
        stamp, _, node = heappop(self._heap)
        if not self._is_current(stamp, node):
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
