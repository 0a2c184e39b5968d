"""The page table and the KV manager of lesson 4, without a model.

Run: pytest tests/test_page_table.py

* ``PageTable.metadata`` (a vectorised gather over rows) equals
  ``BatchMetadata.from_requests`` (lesson 3's obvious Python loop) for random batches;
* ``KVManager.admit`` is all-or-nothing, ``release`` returns everything, rows are reused;
* a random sequence of admissions and releases never loses or double-books a page or a row
  (a property test against a naive model: a dict from row to its pages).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.attention.metadata import BatchMetadata
from minisgl.kvcache.allocator import OutOfBlocksError
from minisgl.scheduler.kv_manager import KVManager
from minisgl.scheduler.page_table import PageTable


def assert_same_metadata(a: BatchMetadata, b: BatchMetadata) -> None:
    for field in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype == torch.int32, field
        assert torch.equal(x, y), (field, x, y)
    assert a.page_size == b.page_size


def random_batch(rng: random.Random, page_size: int, max_rows: int, max_pages: int, num_pool_pages: int):
    """Fill some rows of a fresh table with distinct random pages; pick a batch of them (any order)
    with random cached/new lengths that fit each row's pages."""
    table = PageTable(max_rows, max_pages, page_size)
    pool = list(range(num_pool_pages))
    rng.shuffle(pool)
    owned: dict[int, list[int]] = {}
    for _ in range(rng.randint(1, max_rows)):
        row = table.alloc_row()
        n = rng.randint(1, min(max_pages, len(pool)))
        pages, pool = pool[:n], pool[n:]
        # sometimes append in two pieces, as a request that grows would
        cut = rng.randint(0, n)
        table.append_pages(row, pages[:cut])
        table.append_pages(row, pages[cut:])
        owned[row] = pages
        if not pool:
            break
    rows = rng.sample(sorted(owned), rng.randint(1, len(owned)))
    num_cached, num_new = [], []
    for row in rows:
        capacity = len(owned[row]) * page_size
        total = rng.randint(1, capacity)  # may use fewer pages than reserved
        new = rng.randint(1, total)
        num_cached.append(total - new)
        num_new.append(new)
    return table, owned, rows, num_cached, num_new


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), page_size=st.sampled_from([1, 2, 3, 4, 16]), max_rows=st.sampled_from([8, 24]))
def test_metadata_equals_the_python_reference(seed: int, page_size: int, max_rows: int) -> None:
    """Batches of up to 8 rows (their pages gathered row by row) and up to 24 (most of them past
    ``FEW_ROWS``: one masked gather) against :meth:`BatchMetadata.from_requests`."""
    rng = random.Random(seed)
    table, owned, rows, cached, new = random_batch(rng, page_size, max_rows=max_rows, max_pages=6, num_pool_pages=150)
    ours = table.metadata(rows, cached, new)
    reference = BatchMetadata.from_requests([owned[r] for r in rows], cached, new, page_size)
    assert_same_metadata(ours, reference)
    assert table.pages(rows[0]) == owned[rows[0]]


def test_metadata_of_a_known_batch() -> None:
    table = PageTable(max_rows=4, max_pages_per_row=4, page_size=4)
    a, b = table.alloc_row(), table.alloc_row()
    table.append_pages(a, [7, 2, 9])
    table.append_pages(b, [5, 1])
    # b first: decoding its 7th token (6 cached + 1 new); a prefilling 9 tokens into 3 pages.
    meta = table.metadata([b, a], [6, 0], [1, 9])
    assert meta.qo_indptr.tolist() == [0, 1, 10]
    assert meta.kv_indptr.tolist() == [0, 2, 5]
    assert meta.kv_indices.tolist() == [5, 1, 7, 2, 9]
    assert meta.kv_last_page_len.tolist() == [3, 1]
    assert meta.seq_lens.tolist() == [7, 9]


def test_metadata_refuses_a_request_longer_than_its_pages() -> None:
    table = PageTable(max_rows=2, max_pages_per_row=4, page_size=4)
    row = table.alloc_row()
    table.append_pages(row, [3, 4])
    with pytest.raises(ValueError, match="fewer pages"):
        table.metadata([row], [8], [1])  # 9 tokens need 3 pages
    with pytest.raises(ValueError, match="owns 2"):
        BatchMetadata.from_requests([[3, 4]], [8], [1], 4)
    with pytest.raises(ValueError, match="max_pages_per_row"):
        table.append_pages(row, [5, 6, 7])


def test_admit_is_all_or_nothing_and_release_returns_everything() -> None:
    kv = KVManager(num_pages=10, page_size=4, max_running=3, max_seq_len=64)
    assert kv.pages_needed(1) == 1 and kv.pages_needed(4) == 1 and kv.pages_needed(5) == 2
    r0 = kv.admit(17)  # 5 pages
    assert kv.allocator.num_free == 5 and len(kv.page_table.pages(r0)) == 5
    assert not kv.can_admit(24) and kv.can_admit(20)
    table_before = kv.page_table.table.clone()
    with pytest.raises(OutOfBlocksError):
        kv.admit(24)  # 6 pages > 5 free
    assert kv.allocator.num_free == 5 and kv.page_table.num_free_rows == 2, "a failed admit changes nothing"
    assert torch.equal(kv.page_table.table, table_before)

    r1, r2 = kv.admit(4), kv.admit(4)
    assert not kv.can_admit(1), "no free row left"
    with pytest.raises(RuntimeError, match="row"):
        kv.admit(1)
    assert kv.allocator.num_free == 3, "running out of rows must not leak pages"
    pages = [p for r in (r0, r1, r2) for p in kv.page_table.pages(r)]
    assert len(set(pages)) == 7

    for r in (r1, r0, r2):
        kv.release(r)
    assert kv.allocator.num_free == 10 and kv.page_table.num_free_rows == 3
    assert int(kv.page_table.num_pages.sum()) == 0


def test_rows_are_reused_with_fresh_pages() -> None:
    kv = KVManager(num_pages=8, page_size=2, max_running=2, max_seq_len=16)
    a = kv.admit(6)
    b = kv.admit(2)
    kv.release(a)
    c = kv.admit(4)
    assert c == a, "a released row is handed out again"
    assert len(kv.page_table.pages(c)) == 2, "the reused row holds only its new owner's pages"
    assert not set(kv.page_table.pages(c)) & set(kv.page_table.pages(b))
    meta = kv.page_table.metadata([c], [0], [4])
    assert meta.kv_indices.tolist() == kv.page_table.pages(c)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 10)), max_size=60))
def test_admit_release_against_a_naive_model(ops) -> None:
    num_pages, page_size, max_running = 24, 4, 5
    kv = KVManager(num_pages, page_size, max_running, max_seq_len=40)
    model: dict[int, list[int]] = {}  # row -> its pages
    for is_admit, tokens, pick in ops:
        if is_admit:
            need = -(-tokens // page_size)
            fits = need <= num_pages - sum(map(len, model.values())) and len(model) < max_running
            assert kv.can_admit(tokens) == fits
            if fits:
                row = kv.admit(tokens)
                assert row not in model
                model[row] = kv.page_table.pages(row)
                assert len(model[row]) == need
            else:
                with pytest.raises((OutOfBlocksError, RuntimeError)):
                    kv.admit(tokens)
        elif model:
            row = sorted(model)[pick % len(model)]
            kv.release(row)
            del model[row]
        all_pages = [p for pages in model.values() for p in pages]
        assert len(all_pages) == len(set(all_pages)), "a page is booked twice"
        assert kv.allocator.num_free + len(all_pages) == num_pages, "a page was lost"
        assert kv.page_table.num_free_rows + len(model) == max_running, "a row was lost"
        for row, pages in model.items():
            assert kv.page_table.pages(row) == pages, "an owner's pages changed under it"


def test_a_decode_batch_of_its_buckets_size_is_not_copied_to_be_padded() -> None:
    """The graph runner pads every decode batch to its bucket before each replay; at the
    bucket's own size (every bs=1 step) ``padded`` returns the metadata itself: no new tensors
    on the host's path (about 25 µs a step), the same values."""
    from minisgl.attention.metadata import BatchMetadata

    decode = BatchMetadata.from_requests([[7, 2], [5]], [6, 0], [1, 1], 4)
    assert decode.padded(2, scratch_page=9) is decode
    assert decode.padded(3, scratch_page=9) is not decode


def test_both_ways_of_gathering_a_batchs_pages_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same batch of 12 rows, its pages gathered row by row and by one masked gather."""
    import minisgl.scheduler.page_table as page_table

    rng = random.Random(7)
    table, owned, rows, cached, new = random_batch(rng, 4, max_rows=12, max_pages=6, num_pool_pages=100)
    monkeypatch.setattr(page_table, "FEW_ROWS", 100)
    by_row = table.metadata(rows, cached, new)
    monkeypatch.setattr(page_table, "FEW_ROWS", 0)
    assert_same_metadata(table.metadata(rows, cached, new), by_row)
    assert_same_metadata(by_row, BatchMetadata.from_requests([owned[r] for r in rows], cached, new, 4))
