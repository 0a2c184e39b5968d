"""release_unverified_pages() truncates the row under lesson 4's KV manager too.

Breaks lesson 4's reservation: pages the request was promised for its later tokens go back to
the pool, so its row no longer holds its whole life (and the manager's accounts are wrong).
"""
# first: lessons/l12/test_l12_engine.py::test_lesson4_kv_manager_only_moves_the_counts


def release_unverified_pages(kv, req):
    keep = max(kv.pages_needed(req.num_cached), req.num_tree_pages)
    kv.allocator.free(kv.page_table.truncate(req.table_row, keep))
