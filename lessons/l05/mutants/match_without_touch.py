"""match_prefix() never calls self._touch(path): a match does not count as a use.

Breaks LRU eviction: a prefix that every request reuses is evicted as if nobody had read it
since it was inserted.
"""
# first: lessons/l05/test_l05_tree.py::test_eviction_is_lru

from collections.abc import Sequence

from minisgl.kvcache.radix_cache import MatchResult, RadixCache, _as_key


def match_prefix(self: RadixCache, token_ids: Sequence[int]) -> MatchResult:
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
    return MatchResult(node=node, pages=pages, num_tokens=pos)  # BUG: no self._touch(path)
