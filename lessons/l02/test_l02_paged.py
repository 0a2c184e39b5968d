"""Lesson 2: a paged KV pool, shared by several requests, still gives exactly Hugging Face's tokens.

Run: pytest lessons/l02

Every request owns a block table over one shared token-flat pool (``[num_slots, H_kv, D]`` per
layer). These tests check parity with HF (one request at a time, then several decoding
interleaved over the same pool), the reservation invariant, that a deliberately shifted slot
mapping is caught, and that running out of blocks is a clear error that leaks nothing.
The pure bookkeeping (slot formula, allocator and block-table exhaustion, sizing) is in
``test_l02_blocks.py``; the allocator's property tests are ``test_l02_property.py``.
"""

from __future__ import annotations

import functools
from collections import deque

import pytest
import torch

from minisgl.attention.token_paged import PagedSequence, TokenPagedBackend
from minisgl.generate import SequenceGenerator, generate
from minisgl.kvcache import BlockAllocator, OutOfBlocksError, TokenKVPool
from minisgl.models import load_model
from minisgl.testing import ARCHITECTURES, TEST_PROMPTS, HFReference, distinct_fraction, tiny_checkpoint
from minisgl.tokenizer import load_tokenizer

NEW_TOKENS = 40
BLOCK_SIZES = (1, 16)


@functools.cache
def setup(arch: str):
    path = tiny_checkpoint(arch)
    return load_model(path), load_tokenizer(path)


@functools.cache
def hf_tokens(arch: str, prompt: str, n: int = NEW_TOKENS) -> tuple[int, ...]:
    """HF's greedy tokens for ``prompt`` generated alone (never stopping early), computed once."""
    model, tok = setup(arch)
    return tuple(HFReference(tiny_checkpoint(arch)).greedy(tok.encode(prompt), n))


def make_pool(model, num_blocks: int, block_size: int, extra_slots: int = 0):
    """A fresh pool of ``num_blocks * block_size (+ extra_slots)`` slots and its allocator."""
    pool = TokenKVPool.for_model(model.config, num_blocks * block_size + extra_slots, torch.float32, "cpu")
    return pool, BlockAllocator(num_blocks)


def blocks_needed(num_positions: int, block_size: int) -> int:
    return -(-num_positions // block_size)


def kv_positions(prompt_len: int, max_new_tokens: int) -> int:
    """Positions a request ever holds KV for: the last sampled token is never fed back."""
    return prompt_len + max_new_tokens - 1


def interleaved_owners(tables: dict[int, list[int]]) -> bool:
    """True if, walking the physical block ids in order, some request's blocks are split by another's.

    E.g. block owners ``A A B A`` (sorted by physical id) are interleaved; ``A A B B`` are not.
    """
    owners = [rid for _, rid in sorted((b, rid) for rid, blocks in tables.items() for b in blocks)]
    runs = [rid for i, rid in enumerate(owners) if i == 0 or owners[i - 1] != rid]
    return len(runs) != len(set(runs))


# --- parity: one request at a time ----------------------------------------------------------


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_tokens_identical_to_hf(arch: str, block_size: int) -> None:
    model, tok = setup(arch)
    num_blocks = blocks_needed(kv_positions(max(len(tok.encode(p)) for p in TEST_PROMPTS), NEW_TOKENS), block_size)
    pool, allocator = make_pool(model, num_blocks, block_size)
    outputs = []
    for prompt in TEST_PROMPTS:
        ids = tok.encode(prompt)
        seq = PagedSequence(pool, allocator, block_size)
        ours = generate(model, seq, ids, NEW_TOKENS)
        assert ours == list(hf_tokens(arch, prompt)), f"{arch}, block_size={block_size}: mismatch for {prompt!r}"
        assert len(ours) == NEW_TOKENS and distinct_fraction(ours) > 0.5, ours  # teeth: a diverse model
        # Finished: every block is back in the free list, the table is empty.
        assert seq.table.blocks == [] and allocator.num_free == num_blocks and allocator.num_allocated == 0
        outputs.append(tuple(ours))
    assert len(set(outputs)) == len(outputs), "different prompts must give different generations"


# --- parity: several requests interleaved over one pool ---------------------------------------


def run_interleaved(model, tok, prompts, max_new, pool, allocator, block_size, max_running):
    """Step requests round-robin over one pool; admit a waiting one whenever a running one finishes.

    Returns each request's tokens, whether blocks of different requests were ever interleaved in
    physical id order, and which requests each physical block served over the run.
    """
    waiting = deque(range(len(prompts)))
    running: dict[int, SequenceGenerator] = {}
    outputs: dict[int, list[int]] = {}
    block_users: dict[int, set[int]] = {}
    saw_interleaving = False
    while waiting or running:
        while waiting and len(running) < max_running:
            rid = waiting.popleft()
            kv = PagedSequence(pool, allocator, block_size)
            running[rid] = SequenceGenerator(model, kv, tok.encode(prompts[rid]), max_new[rid])
        for rid, gen in list(running.items()):  # one step of every running request, in turn
            gen.step()
            for b in gen.kv.table.blocks:
                block_users.setdefault(b, set()).add(rid)
            live = {r: g.kv.table.blocks for r, g in running.items()}
            saw_interleaving |= interleaved_owners(live)
            # Pool accounting holds after every step: what the tables hold is what is allocated.
            assert allocator.num_allocated == sum(len(b) for b in live.values())
            assert allocator.num_free + allocator.num_allocated == allocator.num_blocks
            if gen.finished:
                outputs[rid] = gen.output_ids
                del running[rid]
    return outputs, saw_interleaving, block_users


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_interleaved_requests_share_one_pool(arch: str, block_size: int) -> None:
    """Requests of different lengths decode round-robin over ONE pool; each still equals HF run alone.

    At most three run at once and the pool only holds the three largest: later requests must
    reuse blocks that finished requests gave back (with their stale K/V still in them).
    """
    model, tok = setup(arch)
    prompts = list(TEST_PROMPTS)
    max_new = [40, 32, 36, 40, 34]  # they finish at different steps
    needs = [blocks_needed(kv_positions(len(tok.encode(p)), n), block_size) for p, n in zip(prompts, max_new)]
    num_blocks = sum(sorted(needs)[-3:])
    assert num_blocks < sum(needs), "the pool must be too small for all requests at once"
    pool, allocator = make_pool(model, num_blocks, block_size)

    outputs, saw_interleaving, block_users = run_interleaved(
        model, tok, prompts, max_new, pool, allocator, block_size, max_running=3
    )

    for rid, prompt in enumerate(prompts):
        assert outputs[rid] == list(hf_tokens(arch, prompt)[: max_new[rid]]), f"request {rid} ({prompt!r}) differs from HF"
    assert saw_interleaving, "blocks of different requests should interleave in the pool"
    assert any(len(users) > 1 for users in block_users.values()), "some freed block should have been reused"
    assert allocator.num_free == num_blocks and allocator.num_allocated == 0, "all blocks back after the run"


# --- the reservation invariant ------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_reservation_invariant(block_size: int) -> None:
    """After prefill of T tokens the table holds exactly ceil(T / block_size) blocks and exactly T
    slots are written; each decode step writes one more, and a block is added only when crossing a
    block boundary."""
    model, tok = setup("qwen3")
    ids = tok.encode(TEST_PROMPTS[2])
    T, new_tokens = len(ids), 20
    num_blocks = blocks_needed(kv_positions(T, new_tokens), block_size) + 2
    pool, allocator = make_pool(model, num_blocks, block_size)
    seq = PagedSequence(pool, allocator, block_size)
    gen = SequenceGenerator(model, seq, ids, new_tokens)

    def written_slots(layer: int) -> int:  # the pool starts zeroed; real K rows are never all zero
        return int((pool.k[layer].flatten(1) != 0).any(dim=1).sum())

    gen.step()  # prefill
    assert gen.num_cached == T
    assert len(seq.table.blocks) == blocks_needed(T, block_size) == allocator.num_allocated
    # The KV of exactly T positions is in the pool: the sampled token has none yet.
    written = [written_slots(layer) for layer in range(model.config.num_layers)]
    assert written == [T] * model.config.num_layers, f"after prefill exactly {T} slots per layer hold KV, got {written}"
    assert seq.backend.slot_mapping.tolist() == seq.table.slots(0, T).tolist()

    while not gen.finished:
        before = len(seq.table.blocks)
        gen.step()  # writes the KV of position gen.num_cached - 1 (the token sampled last step)
        if gen.finished:
            break
        kv_len = gen.num_cached
        assert written_slots(0) == kv_len, f"{kv_len} positions cached but {written_slots(0)} slots written"
        assert len(seq.table.blocks) == blocks_needed(kv_len, block_size)
        crossed = (kv_len - 1) % block_size == 0  # the position just written opened a new block
        assert len(seq.table.blocks) - before == int(crossed)
        assert seq.backend.slot_mapping.tolist() == seq.table.slots(kv_len - 1, kv_len).tolist()
    assert seq.table.blocks == [] and allocator.num_free == num_blocks


def test_backend_metadata_shapes() -> None:
    """Index tensors are 1-D int64 (a 2-D or int32 index silently means something else)."""
    model, tok = setup("llama")
    pool, allocator = make_pool(model, 8, 4)
    seq = PagedSequence(pool, allocator, 4)
    backend = seq.prepare(0, 6)
    assert backend.slot_mapping.dtype == torch.int64 and backend.slot_mapping.dim() == 1
    assert backend.kv_indices.dtype == torch.int64 and backend.kv_indices.shape == (6,)
    backend = seq.prepare(6, 1)
    assert backend.slot_mapping.shape == (1,) and backend.kv_indices.shape == (7,) and backend.num_cached == 6
    seq.release()
    assert allocator.num_free == 8


# --- teeth: the classic bugs are caught by the parity check ----------------------------------------


class OffBySlotSequence(PagedSequence):
    """The classic bug: new K/V written one slot too far (e.g. ``cur_len + 1`` as the write position)."""

    def prepare(self, num_cached, num_new):
        backend = super().prepare(num_cached, num_new)
        backend.slot_mapping = backend.slot_mapping + 1  # the bug
        return backend


class WrongLayerBackend(TokenPagedBackend):
    """Forgetting the layer index: every layer writes into (and reads) layer 0's pool."""

    def forward(self, q, k, v, layer_id):
        return super().forward(q, k, v, 0)


class WrongLayerSequence(PagedSequence):
    def __init__(self, pool, allocator, block_size):
        super().__init__(pool, allocator, block_size)
        self.backend = WrongLayerBackend(pool)


@pytest.mark.parametrize("buggy", [OffBySlotSequence, WrongLayerSequence])
def test_parity_check_catches_a_broken_slot_mapping(buggy) -> None:
    model, tok = setup("llama")
    block_size = 16
    # One spare slot past the last block, so that the shifted write stays inside the pool tensor.
    pool, allocator = make_pool(model, 8, block_size, extra_slots=1)
    mismatches = 0
    for prompt in TEST_PROMPTS:
        ours = generate(model, buggy(pool, allocator, block_size), tok.encode(prompt), NEW_TOKENS)
        mismatches += ours != list(hf_tokens("llama", prompt))
    assert mismatches >= len(TEST_PROMPTS) - 1, "the parity check must notice a corrupted slot mapping"
    assert allocator.num_free == 8


# --- running out of blocks --------------------------------------------------------------------------


def test_generate_out_of_blocks_is_clear_and_leaks_nothing() -> None:
    """A request that outgrows the pool mid-decode fails with OutOfBlocksError; the failed reserve
    allocates nothing, the generator gives back every block the request held, and a request
    sharing the pool finishes with HF's tokens untouched."""
    model, tok = setup("qwen2")
    block_size = 4
    short, long = TEST_PROMPTS[0], TEST_PROMPTS[2]  # 4 and 24 tokens
    n_short = 32
    short_blocks = blocks_needed(kv_positions(len(tok.encode(short)), n_short), block_size)
    num_blocks = short_blocks + blocks_needed(len(tok.encode(long)), block_size) + 2  # the long one runs dry
    pool, allocator = make_pool(model, num_blocks, block_size)

    a = SequenceGenerator(model, PagedSequence(pool, allocator, block_size), tok.encode(short), n_short)
    # The short request gets its worst case up front (as lesson 4's admission will do), so only the
    # long one can run dry; reserve() only ever allocates the shortfall, so prepare adds nothing later.
    a.kv.table.reserve(allocator, kv_positions(len(tok.encode(short)), n_short))
    b = SequenceGenerator(model, PagedSequence(pool, allocator, block_size), tok.encode(long), NEW_TOKENS)
    failed = False
    while not a.finished:
        a.step()
        if not failed:
            free_before, out_before = allocator.num_free, list(b.output_ids)
            try:
                b.step()
            except OutOfBlocksError as err:
                failed = True
                assert err.requested == 1 and err.free == free_before == 0
                assert b.output_ids == out_before, "a failed step records no token"
                assert b.finished and b.finish_reason == "abort"
                assert b.kv.table.blocks == [], "the generator gave the request's blocks back"
                assert allocator.num_allocated == len(a.kv.table.blocks)
    assert failed, "the long request should have run out of blocks"
    assert a.output_ids == list(hf_tokens("qwen2", short)[:n_short]), "the surviving request must be unharmed"
    assert allocator.num_free == num_blocks and allocator.num_allocated == 0, "nothing leaked"


def test_prompt_larger_than_pool_fails_before_allocating() -> None:
    model, tok = setup("qwen3")
    ids = tok.encode(TEST_PROMPTS[3])  # 56 tokens
    pool, allocator = make_pool(model, 3, 16)  # 48 slots
    seq = PagedSequence(pool, allocator, 16)
    with pytest.raises(OutOfBlocksError, match="requested 4 blocks, only 3 free"):
        generate(model, seq, ids, 4)
    assert seq.table.blocks == [] and allocator.num_free == 3


def test_paged_sequence_rejects_a_pool_too_small_for_its_allocator() -> None:
    model, _ = setup("qwen3")
    pool = TokenKVPool.for_model(model.config, 31, torch.float32, "cpu")
    with pytest.raises(ValueError, match="more slots than the pool"):
        PagedSequence(pool, BlockAllocator(2), 16)
