"""evict() removes a leaf but does not offer its parent, which may now be an unreferenced leaf.

Breaks "free at least num_pages pages if possible": once the leaves are gone, their parents are
never evicted (the tree keeps pages nobody can free, and the pool runs dry).
"""
# first: lessons/l05/test_l05_tree.py::test_evict_leaf_then_its_parent

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
        del node.parent.children[node.key[: self.page_size]]
        node.parent, node.evicted = None, True
        freed.extend(node.pages)
        self._owned.difference_update(node.pages)
        self._evictable_pages -= len(node.pages)
        self._num_nodes -= 1  # BUG: no self._push_if_evictable(parent)
    return freed
