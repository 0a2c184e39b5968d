"""release_unverified_pages() does nothing: rejected drafts' pages stay in the request's row until it finishes.

Breaks "after every step a decoding request owns exactly its verified KV's pages": the tokens
stay right, but pages that hold only garbage are kept from the pool (and from other requests).
"""
# first: lessons/l12/test_l12_engine.py::test_alone_and_batched_match_hf


def release_unverified_pages(kv, req):
    return None
