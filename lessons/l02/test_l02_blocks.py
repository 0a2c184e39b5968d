"""Lesson 2 bookkeeping without a model: the slot formula, exhaustion, release, sizing.

Run: pytest lessons/l02
"""

from __future__ import annotations

import pytest
import torch

from minisgl.config import ModelConfig
from minisgl.kvcache import (
    BlockAllocator,
    BlockTable,
    InvalidFreeError,
    KVCacheFullError,
    OutOfBlocksError,
    TokenKVPool,
    num_blocks_for_budget,
    num_slots_for_budget,
)

KiB, GiB = 1024, 1024**3


def qwen3_0_6b_config() -> ModelConfig:
    """The real Qwen3-0.6B shape (its config.json; lessons/l02/README.md sizes the KV with it); no weights needed."""
    return ModelConfig(
        architecture="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
        num_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
        max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False, qk_norm=True,
        dtype=torch.bfloat16,
    )


# --- the slot formula ---------------------------------------------------------------------------


def test_slot_is_block_id_times_block_size_plus_offset() -> None:
    table = BlockTable(block_size=4, blocks=[5, 2, 9])
    slots = table.slots(0, 12)
    assert slots.dtype == torch.int64 and slots.shape == (12,)
    assert slots.tolist() == [20, 21, 22, 23, 8, 9, 10, 11, 36, 37, 38, 39]
    for pos in range(12):
        block_id, offset = table.blocks[pos // 4], pos % 4
        assert slots[pos] == block_id * table.block_size + offset
    # A window in the middle (what a decode step asks for) crosses the block boundary correctly.
    assert table.slots(3, 6).tolist() == [23, 8, 9]
    assert table.slots(7, 7).tolist() == []
    empty = BlockTable(block_size=4).slots(0, 0)  # no blocks yet: still int64 (torch.tensor([]) is float)
    assert empty.dtype == torch.int64 and empty.shape == (0,)
    assert table.slots(0, 3, device="meta").device.type == "meta", "the slots are made on the device asked for"


def test_slots_beyond_the_reservation_are_refused() -> None:
    table = BlockTable(block_size=4, blocks=[1, 0])
    assert table.capacity == 8
    with pytest.raises(IndexError, match="beyond the reserved capacity"):
        table.slots(0, 9)


def test_block_size_one_is_a_plain_slot_list() -> None:
    allocator = BlockAllocator(10)
    table = BlockTable(block_size=1)
    table.reserve(allocator, 7)
    assert table.slots(0, 7).tolist() == table.blocks


def test_pool_store_and_gather_by_slot() -> None:
    pool = TokenKVPool(num_layers=2, num_slots=12, num_kv_heads=2, head_dim=3)
    slots = torch.tensor([7, 2, 9])
    k = torch.arange(18, dtype=torch.float32).reshape(3, 2, 3)
    pool.store(1, slots, k, -k)
    k_out, v_out = pool.gather(1, slots)
    assert torch.equal(k_out, k) and torch.equal(v_out, -k)
    assert torch.equal(pool.k[1][2], k[1])  # slot 2 holds the second token
    assert not pool.k[0].any(), "another layer must be untouched"
    assert int((pool.k[1].flatten(1) != 0).any(1).sum()) == 3, "exactly the three given slots are written"


# --- reserve on demand ------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_reserve_allocates_only_when_crossing_a_block_boundary(block_size: int) -> None:
    allocator = BlockAllocator(64)
    table = BlockTable(block_size)
    for num_tokens in range(1, 3 * block_size + 2):
        before = list(table.blocks)
        table.reserve(allocator, num_tokens)
        assert len(table.blocks) == -(-num_tokens // block_size)  # ceil
        assert table.blocks[: len(before)] == before, "blocks already held never move"
        crossed = (num_tokens - 1) % block_size == 0
        assert len(table.blocks) - len(before) == int(crossed)
    table.reserve(allocator, 1)  # asking for less than held changes nothing
    assert len(table.blocks) == -(-(3 * block_size + 1) // block_size)
    table.release(allocator)
    assert table.blocks == [] and allocator.num_free == 64


# --- exhaustion -----------------------------------------------------------------------------------


def test_allocator_exhaustion_is_clear_and_changes_nothing() -> None:
    allocator = BlockAllocator(8)
    held = allocator.alloc(5)
    with pytest.raises(OutOfBlocksError, match="requested 4 blocks, only 3 free") as info:
        allocator.alloc(4)
    assert isinstance(info.value, KVCacheFullError), "callers may catch the lesson-1 error type"
    assert (info.value.requested, info.value.free) == (4, 3)
    assert allocator.num_free == 3 and allocator.num_allocated == 5
    rest = allocator.alloc(3)  # exactly what is left still works
    assert sorted(held + rest) == list(range(8))
    with pytest.raises(OutOfBlocksError):
        allocator.alloc(1)
    assert allocator.alloc(0) == []
    allocator.free(held + rest)
    assert allocator.num_free == 8 and allocator.num_allocated == 0


def test_block_table_reserve_exhaustion_leaves_table_and_pool_unchanged() -> None:
    allocator = BlockAllocator(6)
    other = BlockTable(block_size=4)
    other.reserve(allocator, 9)  # 3 blocks
    table = BlockTable(block_size=4)
    table.reserve(allocator, 5)  # 2 blocks
    blocks_before, free_before = list(table.blocks), allocator.num_free
    with pytest.raises(OutOfBlocksError, match="requested 2 blocks, only 1 free"):
        table.reserve(allocator, 13)  # needs 4 blocks in all: 2 more, only 1 free
    assert table.blocks == blocks_before and allocator.num_free == free_before == 1
    table.reserve(allocator, 12)  # 3 blocks: fits
    table.release(allocator)
    other.release(allocator)
    assert allocator.num_free == 6 and allocator.num_allocated == 0


def test_double_free_and_foreign_ids_are_rejected() -> None:
    allocator = BlockAllocator(4)
    table = BlockTable(block_size=2)
    table.reserve(allocator, 4)
    blocks = list(table.blocks)
    table.release(allocator)
    with pytest.raises(InvalidFreeError, match="not allocated"):
        allocator.free(blocks)  # freeing twice
    with pytest.raises(InvalidFreeError):
        allocator.free([17])  # never existed
    a = allocator.alloc(2)
    with pytest.raises(InvalidFreeError, match="duplicate"):
        allocator.free([a[0], a[0]])
    assert allocator.num_allocated == 2 and allocator.num_free == 2  # nothing changed
    allocator.free(a)
    assert allocator.num_free == 4


def test_blocks_are_reused_first_in_first_out() -> None:
    """alloc takes blocks from the front of the free list, free puts them at its back: a block
    just freed is handed out after every block that was already free (a use-after-free then
    reads a block nobody has written since, and shows)."""
    allocator = BlockAllocator(6)
    assert allocator.alloc(2) == [0, 1], "blocks come from the front of the free list, in order"
    assert allocator.alloc(1) == [2]
    allocator.free([1, 0])
    assert allocator.alloc(3) == [3, 4, 5], "blocks that were free all along go first"
    assert allocator.alloc(2) == [1, 0], "then the freed ones, in the order they were freed"
    allocator.free([4])
    allocator.free([2, 3])
    assert allocator.alloc(3) == [4, 2, 3]


def test_a_rejected_free_changes_nothing() -> None:
    """free validates the whole request first: a bad id anywhere in it (first, last, a repeat)
    leaves every block where it was, including the valid ones before it."""
    allocator = BlockAllocator(5)
    held = allocator.alloc(3)  # [0, 1, 2]; 3 and 4 are free
    for bad in ([held[0], 3], [held[1], held[0], 17], [held[2], held[0], held[2]], [-1, held[0]]):
        with pytest.raises(InvalidFreeError):
            allocator.free(bad)
        assert (allocator.num_free, allocator.num_allocated) == (2, 3), f"free({bad}) changed the allocator"
    assert allocator.alloc(2) == [3, 4], "the valid ids of a rejected free were not freed"
    allocator.free(held)
    assert allocator.num_free == 3 and allocator.num_allocated == 2


def test_free_takes_any_iterable_once() -> None:
    """``blocks`` may be a generator: it is read once, and every block in it comes back."""
    allocator = BlockAllocator(4)
    held = allocator.alloc(4)
    allocator.free(b for b in held[:3])
    assert (allocator.num_free, allocator.num_allocated) == (3, 1)
    with pytest.raises(InvalidFreeError, match="not allocated"):
        allocator.free(b for b in held[:2])  # already freed
    assert allocator.alloc(3) == held[:3]


def test_allocator_needs_at_least_one_block() -> None:
    with pytest.raises(ValueError):
        BlockAllocator(0)
    with pytest.raises(ValueError):
        BlockAllocator(3).alloc(-1)


# --- sizing ---------------------------------------------------------------------------------------


def test_sizing_for_qwen3_0_6b() -> None:
    cfg = qwen3_0_6b_config()
    # 2 (K and V) x 8 KV heads x 128 dims x 28 layers x 2 bytes = 112 KiB per token in bf16.
    assert cfg.kv_bytes_per_token(torch.bfloat16) == 2 * 8 * 128 * 28 * 2 == 112 * KiB
    assert cfg.kv_bytes_per_token(torch.float32) == 224 * KiB
    # Reserving a 32k context up front costs 3.5 GiB per request; 1k tokens only 112 MiB.
    assert 32768 * cfg.kv_bytes_per_token(torch.bfloat16) == 3.5 * GiB
    assert num_slots_for_budget(cfg, 1 * GiB, torch.bfloat16) == 9362  # 1 GiB / 112 KiB, rounded down
    assert num_blocks_for_budget(cfg, 1 * GiB, 16, torch.bfloat16) == 585  # 9362 // 16
    assert num_slots_for_budget(cfg, 40 * GiB, torch.bfloat16) == 374491  # ~366k tokens in 40 GiB
