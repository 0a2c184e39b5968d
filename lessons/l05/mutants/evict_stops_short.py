"""evict() counts the *tokens* it freed (len(node.key)) against num_pages.

Breaks "free at least num_pages pages if possible": with page size > 1 it stops after freeing
fewer pages than asked, and the allocator that asked still runs short.
"""
# first: lessons/l05/test_l05_tree.py::test_page_sizes

from heapq import heappop

from minisgl.kvcache.radix_cache import RadixCache


def evict(self: RadixCache, num_pages: int | float) -> list[int]:
    if num_pages < 0:
        raise ValueError(f"cannot evict a negative number of pages ({num_pages})")
    freed: list[int] = []
    freed_tokens = 0
    while freed_tokens < num_pages and self._heap:  # BUG: tokens compared with pages
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
        freed_tokens += len(node.key)
    return freed
