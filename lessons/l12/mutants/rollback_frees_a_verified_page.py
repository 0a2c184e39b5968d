"""release_unverified_pages() keeps only the full pages of verified KV (``num_cached // page_size``).

Breaks "only pages holding nothing but rejected drafts go back": the last page of verified KV is
freed while the request still attends over it (another request may overwrite it).
"""
# first: lessons/l12/test_l12_engine.py::test_alone_and_batched_match_hf

from minisgl.scheduler.kv_manager import KVManager


def release_unverified_pages(kv, req):
    if isinstance(kv, KVManager):
        return
    keep = max(req.num_cached // kv.page_size, req.num_tree_pages)
    kv.allocator.free(kv.page_table.truncate(req.table_row, keep))
