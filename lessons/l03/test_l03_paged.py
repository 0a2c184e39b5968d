"""Lesson 3: one paged-attention call for a whole ragged batch, reading K/V straight from pages.

Run: pytest lessons/l03            (the GPU half: pytest -m gpu lessons/l03)

What these tests prove, on the CPU:

* the reference backend (:class:`ReferencePagedBackend`, the definition every fast kernel is
  checked against) equals naive dense attention applied to each request's contiguous K/V, on
  ragged batches that mix fresh prompts, prompts after a cached prefix and decode steps, for
  GQA ratios 1, 2 and 4, page sizes 1 and 16, lengths on page boundaries and pages scattered
  over the pool;
* :class:`BatchMetadata` keeps its invariants (the README's worked example is checked number
  by number);
* greedy tokens are identical to Hugging Face for all three architectures, and every page
  goes back to the allocator;
* three classic bugs, injected through subclasses, are caught by these same checks.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.attention.dense import dense_causal_attention
from minisgl.attention.factory import make_paged_backend
from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import BlockSequence, ReferencePagedBackend
from minisgl.generate import SequenceGenerator, generate
from minisgl.kvcache.allocator import BlockAllocator
from minisgl.kvcache.block_table import BlockTable
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.models import load_model
from minisgl.testing import ARCHITECTURES, TEST_PROMPTS, HFReference, distinct_fraction, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer

NEW_TOKENS = 40
PAGE_SIZES = (1, 16)
HEAD_DIM = 16
GQA = [(4, 4), (8, 4), (8, 2)]  # (query heads, KV heads): group sizes 1, 2 and 4


# --- a random ragged batch over a scattered pool ---------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def build_case(cached: list[int], new: list[int], page_size: int, hq: int, hkv: int, seed: int = 0):
    """A one-layer pool whose pages are handed out in a shuffled order, filled with garbage.

    Each request's cached K/V is written into its pages at the positions its page list says,
    and kept aside as a plain contiguous tensor too (what the naive definition reads). Returns
    ``(pool, meta, q, k, v, history)`` with ``history[i] = (k_cached [c_i, Hkv, D], v_cached)``.
    """
    gen = torch.Generator().manual_seed(seed)
    needs = [ceil_div(c + n, page_size) for c, n in zip(cached, new)]
    num_pages = sum(needs) + 5  # a few pages nobody owns
    order = list(range(num_pages))
    random.Random(seed).shuffle(order)
    page_lists, at = [], 0
    for n in needs:
        page_lists.append(order[at:at + n])
        at += n
    pool = PagedKVPool(1, num_pages, page_size, hkv, HEAD_DIM)
    # Stale K/V everywhere (as a page freed by a finished request would hold): a backend that
    # reads one slot too many, or a page that is not the request's, sees big wrong numbers.
    pool.k[0].copy_(10 * torch.randn(pool.k[0].shape, generator=gen))
    pool.v[0].copy_(10 * torch.randn(pool.v[0].shape, generator=gen))
    history = []
    for pages, c in zip(page_lists, cached):
        kc = torch.randn(c, hkv, HEAD_DIM, generator=gen)
        vc = torch.randn(c, hkv, HEAD_DIM, generator=gen)
        slots = BlockTable(page_size, list(pages)).slots(0, c)
        pool.store(0, slots, kc, vc)
        history.append((kc, vc))
    meta = BatchMetadata.from_requests(page_lists, cached, new, page_size)
    T = sum(new)
    q = torch.randn(T, hq, HEAD_DIM, generator=gen)
    k = torch.randn(T, hkv, HEAD_DIM, generator=gen)
    v = torch.randn(T, hkv, HEAD_DIM, generator=gen)
    return pool, meta, q, k, v, history


def naive_batch_attention(q, k, v, history, new: list[int]) -> torch.Tensor:
    """The definition: per request, concatenate cached and new K/V into one contiguous tensor
    and run dense causal attention with the right offset. No pages anywhere."""
    outs, at = [], 0
    for (kc, vc), n in zip(history, new):
        k_all = torch.cat([kc, k[at:at + n]])  # [c + n, Hkv, D]
        v_all = torch.cat([vc, v[at:at + n]])
        outs.append(dense_causal_attention(q[at:at + n], k_all, v_all, num_cached=kc.shape[0]))
        at += n
    return torch.cat(outs)


def check_backend(backend_cls, cached, new, page_size, hq, hkv, seed=0) -> None:
    """``backend_cls`` over the paged pool == the naive definition; new K/V land at the right
    positions; pages nobody in the batch owns are left untouched."""
    pool, meta, q, k, v, history = build_case(cached, new, page_size, hq, hkv, seed)
    before_k, before_v = pool.k[0].clone(), pool.v[0].clone()
    backend = backend_cls(pool)
    backend.plan(meta)
    out = backend.forward(q, k, v, layer_id=0)
    torch.testing.assert_close(out, naive_batch_attention(q, k, v, history, new), rtol=1e-5, atol=1e-5)
    # The append: reading request i's pages in order gives back [cached K, new K].
    at = 0
    for i, ((kc, vc), n) in enumerate(zip(history, new)):
        pages = meta.kv_indices[meta.kv_indptr[i]:meta.kv_indptr[i + 1]].long()
        seq_len = kc.shape[0] + n
        k_read = pool.k[0][pages].reshape(-1, hkv, HEAD_DIM)[:seq_len]
        v_read = pool.v[0][pages].reshape(-1, hkv, HEAD_DIM)[:seq_len]
        torch.testing.assert_close(k_read, torch.cat([kc, k[at:at + n]]), rtol=0, atol=0)
        torch.testing.assert_close(v_read, torch.cat([vc, v[at:at + n]]), rtol=0, atol=0)
        at += n
    untouched = sorted(set(range(pool.num_pages)) - set(meta.kv_indices.tolist()))
    assert torch.equal(pool.k[0][untouched], before_k[untouched])
    assert torch.equal(pool.v[0][untouched], before_v[untouched])


def ragged_batch(ps: int) -> tuple[list[int], list[int]]:
    """Fresh prompts, prompts after a cached prefix and decode steps in ONE batch, many of them
    ending exactly on, just before or just after a page boundary."""
    if ps == 1:
        cached = [0, 0, 3, 5, 0, 9, 20, 1]
        new = [1, 7, 4, 1, 2, 1, 6, 1]
    else:
        cached = [0, 0, 0, 5, ps, ps - 1, ps, ps + 1, 2 * ps - 3, 0, 3 * ps + 5]
        new = [ps - 1, ps, ps + 1, 11, 1, 1, ps, 1, 7, 2 * ps + 3, 1]
    return cached, new


def boundary_batches(ps: int) -> list[tuple[list[int], list[int]]]:
    """Sequence lengths ps-1, ps, ps+1 (and 2ps-1, 2ps, 2ps+1), as a prefill and as a decode."""
    lengths = [n for n in (ps - 1, ps, ps + 1, 2 * ps - 1, 2 * ps, 2 * ps + 1) if n >= 1]
    as_prefill = ([0] * len(lengths), lengths)
    as_decode = ([n - 1 for n in lengths], [1] * len(lengths))
    return [as_prefill, as_decode]


# --- the reference backend equals the naive definition ----------------------------------------


@pytest.mark.parametrize("hq,hkv", GQA)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_reference_equals_dense_on_a_ragged_mixed_batch(page_size: int, hq: int, hkv: int) -> None:
    cached, new = ragged_batch(page_size)
    meta = BatchMetadata.from_requests([list(range(100))] * len(new), cached, new, page_size)
    assert not meta.is_decode and (meta.qo_lens == 1).any() and (meta.qo_lens > 1).any()
    check_backend(ReferencePagedBackend, cached, new, page_size, hq, hkv)


@pytest.mark.parametrize("hq,hkv", GQA)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_reference_equals_dense_on_page_boundaries(page_size: int, hq: int, hkv: int) -> None:
    for cached, new in boundary_batches(page_size):
        check_backend(ReferencePagedBackend, cached, new, page_size, hq, hkv)


def test_output_does_not_depend_on_where_pages_live() -> None:
    """Same history, two different page permutations: the same attention output."""
    cached, new = ragged_batch(16)
    outs = []
    for seed in (1, 2):
        pool, meta, q, k, v, history = build_case(cached, new, 16, 8, 2, seed=seed)
        # Same data (drawn after the shuffle with a fixed generator) under different pages:
        gen = torch.Generator().manual_seed(99)
        history = [(torch.randn(kc.shape, generator=gen), torch.randn(kc.shape, generator=gen)) for kc, _ in history]
        for i, (kc, vc) in enumerate(history):
            pages = meta.kv_indices[meta.kv_indptr[i]:meta.kv_indptr[i + 1]].tolist()
            pool.store(0, BlockTable(16, pages).slots(0, kc.shape[0]), kc, vc)
        q, k, v = (torch.randn(t.shape, generator=gen) for t in (q, k, v))
        backend = ReferencePagedBackend(pool)
        backend.plan(meta)
        outs.append((meta.kv_indices.clone(), backend.forward(q, k, v, 0)))
    assert not torch.equal(outs[0][0], outs[1][0]), "the two runs must use different pages"
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=0, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=5),
    page_size=st.sampled_from([1, 2, 4, 16]),
    gqa=st.sampled_from(GQA),
    seed=st.integers(0, 2**16),
)
def test_reference_equals_dense_on_random_batches(data, page_size, gqa, seed) -> None:
    cached, new = [c for c, _ in data], [n for _, n in data]
    check_backend(ReferencePagedBackend, cached, new, page_size, *gqa, seed=seed)


# --- BatchMetadata invariants ------------------------------------------------------------------


def test_readme_worked_example() -> None:
    """The exact numbers of the worked example in lessons/l03/README.md."""
    meta = BatchMetadata.from_requests(
        page_lists=[[7, 2], [0, 4, 9], [5, 1]], num_cached=[0, 8, 4], num_new=[6, 1, 3], page_size=4
    )
    assert meta.qo_indptr.tolist() == [0, 6, 7, 10]
    assert meta.kv_indptr.tolist() == [0, 2, 5, 7]
    assert meta.kv_indices.tolist() == [7, 2, 0, 4, 9, 5, 1]
    assert meta.kv_last_page_len.tolist() == [2, 1, 3]
    assert meta.seq_lens.tolist() == [6, 9, 7]
    batch, positions = meta.new_token_positions()
    assert batch.tolist() == [0, 0, 0, 0, 0, 0, 1, 2, 2, 2]
    assert positions.tolist() == [0, 1, 2, 3, 4, 5, 8, 4, 5, 6]
    assert meta.new_token_slots().tolist() == [28, 29, 30, 31, 8, 9, 36, 4, 5, 6]
    assert meta.new_token_slots()[8] == 1 * 4 + 1  # the token traced by hand in the README
    assert not meta.is_decode and meta.batch_size == 3 and meta.num_tokens == 10


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 20), st.integers(0, 2)), min_size=1, max_size=6),
    page_size=st.sampled_from([1, 2, 4, 16]),
)
def test_metadata_invariants(data, page_size) -> None:
    cached = [c for c, _, _ in data]
    new = [n for _, n, _ in data]
    # Pages handed out by a real allocator, with up to two pages reserved ahead per request.
    allocator = BlockAllocator(sum(ceil_div(c + n, page_size) + extra for c, n, extra in data))
    tables = []
    for c, n, extra in data:
        table = BlockTable(page_size)
        table.reserve(allocator, c + n + extra * page_size)
        tables.append(table)
    meta = BatchMetadata.from_requests([t.blocks for t in tables], cached, new, page_size)

    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"):
        assert getattr(meta, name).dtype == torch.int32, f"{name} must be int32 (FlashInfer's index type)"
    assert meta.seq_lens.tolist() == [c + n for c, n in zip(cached, new)], "KV lengths include the new tokens"
    assert meta.qo_lens.tolist() == new and meta.num_tokens == sum(new)
    last = meta.kv_last_page_len
    assert ((last >= 1) & (last <= page_size)).all(), "a last page holds 1..page_size tokens, never 0"
    assert meta.kv_indptr.diff().tolist() == [ceil_div(c + n, page_size) for c, n in zip(cached, new)]
    # Only the pages in use are described (reserved-ahead pages are not), in position order.
    for i, t in enumerate(tables):
        pages = meta.kv_indices[meta.kv_indptr[i]:meta.kv_indptr[i + 1]].tolist()
        assert pages == t.blocks[: ceil_div(cached[i] + new[i], page_size)]
    assert meta.is_decode == all(n == 1 for n in new)

    # new_token_slots: slot = kv_indices[kv_indptr[i] + p // page_size] * page_size + p % page_size,
    # i.e. exactly lesson 2's BlockTable.slots for positions cached .. cached + new - 1.
    expected = torch.cat([t.slots(c, c + n) for t, c, n in zip(tables, cached, new)])
    assert torch.equal(meta.new_token_slots(), expected)
    assert meta.new_token_slots().unique().numel() == meta.num_tokens, "two new tokens share a slot"


def test_from_requests_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="needs 3 pages for 9 tokens but owns 2"):
        BatchMetadata.from_requests([[0, 1]], [8], [1], page_size=4)
    with pytest.raises(ValueError, match="needs 2 pages"):  # the second request is short of pages
        BatchMetadata.from_requests([[0], [1]], [0, 4], [4, 1], page_size=4)
    with pytest.raises(ValueError, match="at least one new token"):
        BatchMetadata.from_requests([[0]], [3], [0], page_size=4)
    with pytest.raises(ValueError, match="one page list"):
        BatchMetadata.from_requests([[0], [1]], [0], [1, 1], page_size=4)
    with pytest.raises(ValueError, match="one page list"):
        BatchMetadata.from_requests([], [], [], page_size=4)
    # Exactly full pages are fine: the last page is full (len 4), not empty (len 0).
    meta = BatchMetadata.from_requests([[3, 1]], [7], [1], page_size=4)
    assert meta.kv_last_page_len.tolist() == [4] and meta.kv_indptr.tolist() == [0, 2]


# --- parity with Hugging Face ------------------------------------------------------------------


@functools.cache
def setup(arch: str):
    path = tiny_checkpoint(arch)
    return load_model(path), load_tokenizer(path)


@functools.cache
def hf_tokens(arch: str, prompt: str) -> tuple[int, ...]:
    """HF's greedy tokens for ``prompt`` generated alone, computed once per process."""
    _, tok = setup(arch)
    return tuple(HFReference(tiny_checkpoint(arch)).greedy(tok.encode(prompt), NEW_TOKENS))


def pages_for_all_prompts(tok, page_size: int) -> int:
    longest = max(len(tok.encode(p)) for p in TEST_PROMPTS)
    return ceil_div(longest + NEW_TOKENS, page_size)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_tokens_identical_to_hf(arch: str, page_size: int) -> None:
    model, tok = setup(arch)
    num_pages = pages_for_all_prompts(tok, page_size) + 3
    pool = PagedKVPool.for_model(model.config, num_pages, page_size, torch.float32, "cpu")
    allocator = BlockAllocator(num_pages)
    allocator.free(allocator.alloc(3))  # start mid-pool: the requests' pages wrap around
    backend = make_paged_backend(pool, model.config.num_heads, "reference")
    assert isinstance(backend, ReferencePagedBackend)
    assert isinstance(make_paged_backend(pool, model.config.num_heads), ReferencePagedBackend), "auto on CPU"
    outputs = []
    for prompt in TEST_PROMPTS:
        seq = BlockSequence(pool, allocator, backend)  # one shared backend, re-planned every step
        ours = generate(model, seq, tok.encode(prompt), NEW_TOKENS)
        assert ours == list(hf_tokens(arch, prompt)), f"{arch}, page_size={page_size}: mismatch for {prompt!r}"
        assert len(ours) == NEW_TOKENS and distinct_fraction(ours) > 0.5, ours  # teeth: a diverse model
        assert seq.table.blocks == [] and allocator.num_free == num_pages, "every page back after the request"
        outputs.append(tuple(ours))
    assert len(set(outputs)) == len(outputs), "different prompts must give different generations"
    assert allocator.num_allocated == 0


def test_interleaved_requests_share_one_pool_and_one_backend() -> None:
    """Three requests step round-robin over one pool (pages interleave, freed pages get reused);
    each still equals HF run alone."""
    model, tok = setup("qwen3")
    page_size, prompts, max_new = 4, TEST_PROMPTS[1:4], [40, 32, 36]
    needs = [ceil_div(len(tok.encode(p)) + n, page_size) for p, n in zip(prompts, max_new)]
    pool = PagedKVPool.for_model(model.config, sum(needs), page_size, torch.float32, "cpu")
    allocator = BlockAllocator(sum(needs))
    backend = make_paged_backend(pool, model.config.num_heads, "reference")
    gens = [SequenceGenerator(model, BlockSequence(pool, allocator, backend), tok.encode(p), n) for p, n in zip(prompts, max_new)]
    owners_seen = set()
    while not all(g.finished for g in gens):
        for i, g in enumerate(gens):
            if not g.finished:
                g.step()
                owners_seen |= {(b, i) for b in g.kv.table.blocks}
    for g, p, n in zip(gens, prompts, max_new):
        assert g.output_ids == list(hf_tokens("qwen3", p)[:n])
    pages_of = [sorted(b for b, j in owners_seen if j == i) for i in range(3)]
    assert any(p != list(range(p[0], p[-1] + 1)) for p in pages_of), "requests' pages should interleave"
    assert allocator.num_free == sum(needs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prefill_after_a_cached_prefix_equals_hf_logits(arch: str) -> None:
    """Prompt in two forwards (a prefix, then the rest on top of the cached prefix): the
    bottom-right causal alignment gives every position the logits of HF's full forward."""
    model, tok = setup(arch)
    ids = tok.encode(TEST_PROMPTS[3])
    split = 21  # not on a page boundary
    pool = PagedKVPool.for_model(model.config, 8, 16, torch.float32, "cpu")
    allocator = BlockAllocator(8)
    seq = BlockSequence(pool, allocator, make_paged_backend(pool, model.config.num_heads, "reference"))
    first = model(torch.tensor(ids[:split]), torch.arange(split), seq.prepare(0, split))
    rest = model(torch.tensor(ids[split:]), torch.arange(split, len(ids)), seq.prepare(split, len(ids) - split))
    seq.release()
    expected = HFReference(tiny_checkpoint(arch)).logits(ids)
    torch.testing.assert_close(torch.cat([first, rest]), expected, rtol=1e-4, atol=1e-4)
    assert allocator.num_free == 8


# --- teeth: classic bugs, injected, are caught --------------------------------------------------


class LastPageLenModuloBug(ReferencePagedBackend):
    """``kv_last_page_len = seq_len % page_size``: 0 instead of page_size when the last page is full.

    The KV length then comes out a whole page short (and with page size 1, always one short).
    """

    def plan(self, meta: BatchMetadata) -> None:
        super().plan(meta)
        ps = meta.page_size
        buggy_last = [s % ps for s in self._seq_lens]
        self._seq_lens = [(n - 1) * ps + last for n, last in zip(meta.kv_indptr.diff().tolist(), buggy_last)]


class TopLeftCausalMaskBug(ReferencePagedBackend):
    """Causal mask aligned top-left: query ``i`` sees keys ``0..i`` instead of ``0..cached+i``.

    Right for a fresh prompt (no cached prefix), wrong for every decode step and every prefill
    after a cached prefix: what you get when the mask ignores the KV length.
    """

    def forward(self, q, k, v, layer_id):
        pool = self.pool
        pool.store(layer_id, self._write_slots, k, v)
        out = torch.empty_like(q)
        H, D = pool.num_kv_heads, pool.head_dim
        for i, _seq_len in enumerate(self._seq_lens):
            q0, q1 = self._qo[i], self._qo[i + 1]
            pages = self._pages[self._kv[i]:self._kv[i + 1]]
            k_i = pool.k[layer_id][pages].reshape(-1, H, D)[: q1 - q0]  # BUG: only the first T keys
            v_i = pool.v[layer_id][pages].reshape(-1, H, D)[: q1 - q0]
            out[q0:q1] = dense_causal_attention(q[q0:q1], k_i, v_i, num_cached=0)
        return out


class RequestOrderMixupBug(ReferencePagedBackend):
    """``kv_indices`` concatenated in a different request order than ``kv_indptr`` describes
    (requests 0 and 1 swapped, e.g. after sorting one array by length and not the other), so a
    request reads pages of its neighbour. Writes still go to the right slots."""

    def plan(self, meta: BatchMetadata) -> None:
        super().plan(meta)
        if meta.batch_size >= 2:
            kv = meta.kv_indptr.tolist()
            p = self._pages
            self._pages = torch.cat([p[kv[1]:kv[2]], p[kv[0]:kv[1]], p[kv[2]:]])


BUGS = [LastPageLenModuloBug, TopLeftCausalMaskBug, RequestOrderMixupBug]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("buggy", BUGS)
def test_equality_check_catches_injected_bugs(buggy, page_size: int) -> None:
    cached, new = ragged_batch(page_size)
    check_backend(ReferencePagedBackend, cached, new, page_size, 8, 2)  # the code under test passes (yours with --mine)...
    with pytest.raises(AssertionError):  # ...and fails the buggy one
        check_backend(buggy, cached, new, page_size, 8, 2)


@pytest.mark.parametrize("buggy,page_size", [(LastPageLenModuloBug, 16), (TopLeftCausalMaskBug, 1)])
def test_hf_parity_catches_injected_bugs(buggy, page_size: int) -> None:
    """The end-to-end check notices too. (A request-order mix-up needs a batch of two or
    more requests, which the single-request generate loop never builds: only the batch
    equality check above can catch it, which is why lesson 3 has one.)"""
    model, tok = setup("llama")
    num_pages = pages_for_all_prompts(tok, page_size)
    pool = PagedKVPool.for_model(model.config, num_pages, page_size, torch.float32, "cpu")
    allocator = BlockAllocator(num_pages)
    mismatches = 0
    for prompt in TEST_PROMPTS:
        ours = generate(model, BlockSequence(pool, allocator, buggy(pool)), tok.encode(prompt), NEW_TOKENS)
        mismatches += ours != list(hf_tokens("llama", prompt))
    assert mismatches >= len(TEST_PROMPTS) - 1, f"{buggy.__name__} slipped through the parity check"
    assert allocator.num_free == num_pages
