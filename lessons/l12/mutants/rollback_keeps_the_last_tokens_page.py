"""release_unverified_pages() keeps the pages of ``req.seq_len`` tokens, counting the last token, which has no KV yet.

Breaks "a decoding request owns exactly the pages of its verified tokens": when the verified KV
ends at a page boundary, a page that holds only rejected drafts is kept for the next token,
one page more than a plain decode step would hold.
"""
# first: lessons/l12/test_l12_engine.py::test_alone_and_batched_match_hf

from minisgl.scheduler.kv_manager import KVManager


def release_unverified_pages(kv, req):
    if isinstance(kv, KVManager):
        return
    keep = max(kv.pages_needed(req.seq_len), req.num_tree_pages)
    kv.allocator.free(kv.page_table.truncate(req.table_row, keep))
