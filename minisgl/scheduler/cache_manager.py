"""Lesson 5: page ownership with a radix (prefix) cache.

Lesson 4's :class:`~minisgl.scheduler.kv_manager.KVManager` gave every request its own pages,
reserved for its whole life at admission. This manager shares pages through a
:class:`~minisgl.kvcache.radix_cache.RadixCache` and hands them out on demand:

* **Admission** matches the request's tokens in the tree (never the whole sequence: the last
  token is always recomputed, so even a full hit produces logits), locks the match, and
  allocates pages only for the rest of the prompt. Pages the tree could evict count as free.
* **After a prefill** the request's full prompt pages go into the tree at once
  (:meth:`cache_prefix`), so requests that arrive while it still runs share its prefix. If the
  tree already had those tokens (another request of the same batch), the row is re-pointed at
  the tree's pages *before* the duplicates are freed: a page table never points at a free page.
* **Decode** takes one more page when a request crosses a page boundary
  (:meth:`make_room_for_decode`); when even eviction cannot find one, the requests with the
  least progress are **retracted** (:meth:`retract`): back to the queue, their KV in the tree.
* **Release** puts the request's full pages into the tree (finish, abort, retraction) or frees
  them (error), frees the pages the tree already had (a duplicate prefix written by another
  request in the meantime) and unlocks the match.

The ownership invariant, checked by the tests after every step: each page is exactly one of
*free* (in the allocator), *owned by the tree*, or *owned by one running request* (the part of
its page-table row after its ``num_tree_pages`` leading tree pages), so
``free + tree.total_pages + sum(own pages) == num_pages``.
"""

from __future__ import annotations

__lesson__ = 5

from collections.abc import Sequence

from minisgl.core import Req
from minisgl.kvcache.radix_cache import RadixCache
from minisgl.scheduler.kv_manager import PageOwner


class CacheManager(PageOwner):
    """Owns the allocator, the page table (see :class:`PageOwner`) and the radix tree; admits,
    grows and releases requests."""

    # A match may cover at most len(tokens) - MIN_UNCACHED tokens: a full hit would leave nothing
    # to compute and therefore no logits to sample the next token from.
    MIN_UNCACHED = 1

    def __init__(self, num_pages: int, page_size: int, max_running: int, max_seq_len: int) -> None:
        super().__init__(num_pages, page_size, max_running, max_seq_len)
        self.tree = RadixCache(page_size)

    @property
    def available_pages(self) -> int:
        """Pages a new request could get now: free ones plus those the tree can evict."""
        return self.allocator.num_free + self.tree.evictable_pages

    def own_pages(self, req: Req) -> list[int]:
        """The pages of ``req``'s row that belong to ``req`` alone (after its tree pages)."""
        return self.page_table.pages(req.table_row)[req.num_tree_pages:]

    # --- the calls the scheduler makes --------------------------------------------------------
    def admit_request(self, req: Req, running: Sequence[Req] = ()) -> bool:
        """Match, lock, and take pages for the uncached tokens of ``req`` (prompt plus any output
        of an earlier, retracted run). Keeps a page available for every request of ``running``
        that crosses a page boundary at its next decode, so ``req`` is not admitted only to be
        retracted at once. All-or-nothing: on ``False`` nothing changed."""
        if self.page_table.num_free_rows == 0:
            return False
        reserve = sum(1 for r in running if r.seq_len > self.page_table.pages_in_row(r.table_row) * self.page_size)
        tokens = req.all_ids
        match = self.tree.match_prefix(tokens[: len(tokens) - self.MIN_UNCACHED])
        self.tree.lock(match.node)  # before counting: locked pages are no longer evictable
        need = self.pages_needed(len(tokens)) - len(match.pages)
        if need + reserve > self.available_pages:
            self.tree.unlock(match.node)
            return False
        row = self.page_table.alloc_row()
        self.page_table.append_pages(row, match.pages + self._take(need))
        req.table_row, req.cache_node, req.num_tree_pages = row, match.node, len(match.pages)
        req.num_cached = match.num_tokens
        return True

    def ensure_capacity(self, req: Req, num_tokens: int) -> bool:
        """Make ``req``'s row hold ``num_tokens`` positions, evicting from the tree if needed.
        ``False`` (and no change) if the pool cannot give the missing pages."""
        need = self.pages_needed(num_tokens) - self.page_table.pages_in_row(req.table_row)
        if need <= 0:
            return True
        if need > self.available_pages:
            return False
        self.page_table.append_pages(req.table_row, self._take(need))
        return True

    def release_request(self, req: Req, cache: bool = True) -> None:
        """Give back ``req``'s row exactly once. With ``cache``, its full pages of valid KV (the
        first ``num_cached`` tokens, whole pages only) go into the tree; every other page of its
        own is freed; the tree pages it locked are unlocked."""
        if req.table_row < 0:
            return
        row, req.table_row = req.table_row, -1
        pages = self.page_table.pages(row)
        ours = req.num_tree_pages  # pages[:ours] are the tree's own (locked at admission)
        if cache:
            full = req.num_cached // self.page_size
            already = self.tree.insert(req.all_ids[: full * self.page_size], pages[:full]) // self.page_size
            # pages[ours:already]: a prefix the tree got from another request meanwhile (duplicates);
            # pages[already:full]: now the tree's; pages[full:]: a partial page or never written.
            to_free = pages[ours:already] + pages[max(full, ours):]
        else:
            to_free = pages[ours:]
        self.tree.unlock(req.cache_node)
        req.cache_node, req.num_tree_pages = None, 0
        self.allocator.free(to_free)
        self.page_table.free_row(row)

    def cache_prefix(self, req: Req, num_valid: int | None = None) -> None:
        """Hand ``req``'s full pages of valid KV (its first ``num_valid`` tokens, default
        ``num_cached``) to the tree while it keeps running; its row then starts with tree pages
        (locked) up to the last full page. (Lesson 7: with a later batch already launched,
        ``num_cached`` runs ahead of what has been computed, so the caller says how far.)"""
        full = (req.num_cached if num_valid is None else num_valid) // self.page_size
        if full <= req.num_tree_pages:
            return
        row = req.table_row
        pages = self.page_table.pages(row)
        tokens = req.all_ids[: full * self.page_size]
        already = self.tree.insert(tokens, pages[:full]) // self.page_size
        match = self.tree.match_prefix(tokens)  # the tree's pages for all `full` pages now
        assert match.num_tokens == full * self.page_size, "insert must leave the whole prefix in the tree"
        duplicates = pages[req.num_tree_pages:already]  # same tokens, but the tree keeps its own pages
        self.page_table.replace_pages(row, match.pages)
        self.tree.lock(match.node)
        self.tree.unlock(req.cache_node)
        req.cache_node, req.num_tree_pages = match.node, full
        self.allocator.free(duplicates)  # only now: no row points at them any more

    def shares_prefix(self, req: Req, others: Sequence[Req]) -> bool:
        """Would waiting one step turn at least a page of ``req``'s prefill into a hit (because
        one of ``others``, admitted this step or mid-prefill, is computing that prefix)?"""
        ps, tokens = self.page_size, req.all_ids
        limit = len(tokens) - self.MIN_UNCACHED
        for other in others:
            same = common_prefix_len(tokens, other.all_ids, limit)
            if same // ps * ps >= req.num_cached + ps:
                return True
        return False

    # --- decode pages on demand, and retraction -----------------------------------------------
    def make_room_for_decode(self, running: Sequence[Req]) -> tuple[list[Req], list[Req]]:
        """``(decoding, retracted)``. Every decoding request of ``running`` that still wants a
        token is about to write one token's KV (at position ``seq_len - 1``). Give each the page
        it may need, most progress first; when the pool is dry, retract the requests with the
        least progress (fewest generated tokens, then the newest) until the rest fit. One request
        alone always fits: admission checked it fits the empty pool. ``decoding``: the requests
        that decode this step, in running order; ``retracted``: the requests whose KV went into
        the tree (:meth:`retract`), in the order they were retracted. The caller (the scheduler)
        moves them back to its queue."""
        decodes = {r.rid for r in running if r.decoding and r.wants_more}  # once per step
        by_progress = sorted(running, key=lambda r: (-r.num_generated, r.rid))  # victims from the end
        retracted: list[Req] = []
        i = 0
        while i < len(by_progress):
            req = by_progress[i]
            if req.rid not in decodes or self.ensure_capacity(req, req.seq_len):
                i += 1
                continue
            if len(by_progress) == 1:
                raise RuntimeError(
                    f"no page for request {by_progress[0].rid} even alone: {self.allocator.num_free} free, "
                    f"{self.owned_pages()} owned of {self.num_pages} (KV accounting bug)"
                )
            victim = by_progress.pop()  # least progress (may be the request that asked)
            self.retract(victim)
            retracted.append(victim)
        gone = {r.rid for r in retracted}
        return [r for r in running if r.rid in decodes and r.rid not in gone], retracted

    def retract(self, req: Req) -> None:
        """Stop a running request to free its pages: its KV goes into the tree and it owns no
        KV any more (``num_cached == 0``). Re-admission recomputes only what was not cached, and
        its outputs continue exactly as if it had never stopped."""
        self.release_request(req, cache=True)
        req.num_cached = 0
        self.stats.retractions += 1

    def clear_cache(self) -> int:
        """Evict every node no request holds (``tree.reset``) and give its pages back to the
        allocator; returns how many. With no request admitted the tree is empty afterwards
        (lesson 10's ``/flush_cache``)."""
        freed = self.tree.reset()
        self.allocator.free(freed)
        return len(freed)

    # --- internals -------------------------------------------------------------------------------
    def _take(self, n: int) -> list[int]:
        """``n`` pages from the allocator, evicting least recently used tree leaves for the shortfall."""
        short = n - self.allocator.num_free
        if short > 0:
            evicted = self.tree.evict(short)
            self.allocator.free(evicted)
            self.stats.evicted_pages += len(evicted)
        return self.allocator.alloc(n)


def common_prefix_len(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n = min(len(a), len(b), limit)
    return next((i for i in range(n) if a[i] != b[i]), n)
