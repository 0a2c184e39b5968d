"""insert() walks into a node whose pages only partly agree and hangs the new leaf under it, without splitting it.

Breaks the tree's keys: the new leaf's tokens follow the *whole* node instead of the pages they
share, so the new branch can never be matched (and its parent's path is wrong).
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
        pos += num_same * ps
        node = child  # BUG: no split when the new tokens branch off inside child
        path.append(child)
        if num_same < len(child.pages):
            break
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
    return pos
