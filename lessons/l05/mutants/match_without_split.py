"""match_prefix() returns the matched pages but does not split a node the match ends inside.

Breaks "the result's node covers exactly the matched tokens": locking that node protects (and
counts as shared) pages the request never matched, and the tree's structure no longer says
which prefix is cached.
"""
# first: lessons/l05/test_l05_tree.py::test_match_splits_node_at_page_boundary

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
        pages.extend(child.pages[:num_same])
        pos += num_same * ps
        node = child
        path.append(child)
        if num_same < len(child.pages):
            break  # BUG: the match ends inside child, which is not split
    self._touch(path)
    return MatchResult(node=node, pages=pages, num_tokens=pos)
