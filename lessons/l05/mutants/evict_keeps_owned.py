"""evict() unlinks the leaf and returns its pages but leaves them in self._owned.

Breaks the reuse of freed pages: the allocator hands an evicted page out again, and inserting
it for new tokens is refused as "already owned".
"""
# first: lessons/l05/test_l05_tree.py::test_evicted_pages_are_never_matched_again

from heapq import heappop

from minisgl.kvcache.radix_cache import RadixCache


def evict(self: RadixCache, num_pages: int | float) -> list[int]:
    if num_pages < 0:
        raise ValueError(f"cannot evict a negative number of pages ({num_pages})")
    freed: list[int] = []
    while len(freed) < num_pages and self._heap:
        stamp, _, node = heappop(self._heap)
        if not self._is_current(stamp, node):
            continue
        parent = node.parent
        del parent.children[node.key[: self.page_size]]
        node.parent, node.evicted = None, True
        freed.extend(node.pages)  # BUG: the pages stay in self._owned
        self._evictable_pages -= len(node.pages)
        self._num_nodes -= 1
        self._push_if_evictable(parent)
    return freed
