"""The vectorised torch backend (the CPU default) computes exactly what the reference computes."""

from __future__ import annotations

import random

import pytest
import torch

from minisgl.attention.factory import make_paged_backend
from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import ReferencePagedBackend, TorchPagedBackend
from minisgl.kvcache.paged_pool import PagedKVPool


def make_case(seed: int, page_size: int, hq: int, hkv: int, kind: str):
    """A random batch: ``decode`` (one new token per row), ``prefill`` (1-20 new tokens per row)
    or ``mixed`` (lesson 6: some rows decode, others carry prompt chunks after a cached prefix)."""
    rng = random.Random(seed)
    batch = rng.randint(1, 9) if kind != "mixed" else rng.randint(2, 9)
    cached = [rng.randint(0, 70) for _ in range(batch)]
    new = {"decode": lambda i: 1, "prefill": lambda i: rng.randint(1, 20),
           "mixed": lambda i: 1 if i % 2 == 0 else rng.randint(2, 20)}[kind]
    new = [new(i) for i in range(batch)]
    needs = [-(-(c + n) // page_size) for c, n in zip(cached, new)]
    pages = list(range(sum(needs) + 5))
    rng.shuffle(pages)
    lists, at = [], 0
    for n in needs:
        lists.append(pages[at:at + n])
        at += n
    meta = BatchMetadata.from_requests(lists, cached, new, page_size)
    gen = torch.Generator().manual_seed(seed)
    pool = PagedKVPool(2, len(pages), page_size, hkv, 16)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=gen))
    T = sum(new)
    q, k, v = (torch.randn(T, h, 16, generator=gen) for h in (hq, hkv, hkv))
    return pool, meta, q, k, v


def clone(pool: PagedKVPool) -> PagedKVPool:
    twin = PagedKVPool(2, pool.num_pages, pool.page_size, pool.num_kv_heads, pool.head_dim)
    for a, b in zip(twin.k + twin.v, pool.k + pool.v):
        a.copy_(b)
    return twin


@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 4), (8, 2)])
def test_torch_backend_equals_reference(kind: str, page_size: int, hq: int, hkv: int) -> None:
    for seed in range(5):
        pool, meta, q, k, v = make_case(seed, page_size, hq, hkv, kind)
        ref_pool = clone(pool)
        fast, ref = TorchPagedBackend(pool), ReferencePagedBackend(ref_pool)
        fast.plan(meta)
        ref.plan(meta)
        for layer in (0, 1):
            torch.testing.assert_close(fast.forward(q, k, v, layer), ref.forward(q, k, v, layer), rtol=1e-5, atol=1e-5)
        for a, b in zip(pool.k + pool.v, ref_pool.k + ref_pool.v):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_auto_picks_torch_on_cpu() -> None:
    pool = PagedKVPool(1, 4, 4, 2, 8)
    assert isinstance(make_paged_backend(pool, 4), TorchPagedBackend)
