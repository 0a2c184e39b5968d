"""insert() returns how many *pages* were already cached instead of how many tokens.

Breaks the return value's unit (a multiple of page_size): the caller frees the wrong pages as
duplicates, and with page size > 1 keeps pages the tree already had.
"""
# first: lessons/l05/test_l05_tree.py::test_insert_returns_already_cached_prefix

from collections.abc import Sequence

from minisgl.kvcache.radix_cache import RadixCache, RadixNode, _as_key


def insert(self: RadixCache, token_ids: Sequence[int], pages: Sequence[int]) -> int:
    tokens = _as_key(token_ids)
    ps = self.page_size
    if len(tokens) != len(pages) * ps:
        raise ValueError(f"insert needs page-aligned tokens: {len(tokens)} tokens for {len(pages)} pages of {ps}")
    node, pos, path = self.root, 0, []
    while pos < len(tokens):
        child = node.children.get(tokens[pos : pos + ps])
        if child is None:
            break
        num_same = self._common_pages(child.key, tokens, pos)
        if num_same < len(child.pages) and pos + num_same * ps < len(tokens):
            child = self._split(child, num_same)
        pos += num_same * ps
        node = child
        path.append(child)
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
    return pos // ps  # BUG: pages, not tokens
