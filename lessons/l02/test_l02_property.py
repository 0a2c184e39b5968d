"""Lesson 2, property tests (hypothesis): the block allocator and block tables against a naive model.

Run: pytest lessons/l02/test_l02_property.py   (part of pytest lessons/l02, so of --mine too)

The allocator must never hand a block (hence a slot) out twice and never lose one, whatever the
order of allocations, frees, failed allocations and invalid frees; a rejected free changes
nothing; and the free list is FIFO (a block freed now is handed out after every block that was
free before it). The model is the obvious one: the free ids as a queue, in order, and a list of
live allocations.
"""

from __future__ import annotations

from collections import deque

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minisgl.kvcache import BlockAllocator, BlockTable, InvalidFreeError, OutOfBlocksError

SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class AllocatorMachine(RuleBasedStateMachine):
    """Random alloc / free / bad-free sequences; the model is a set of free ids plus live allocations."""

    @initialize(num_blocks=st.integers(1, 24))
    def start(self, num_blocks: int) -> None:
        self.allocator = BlockAllocator(num_blocks)
        self.model_free = set(range(num_blocks))
        self.model_queue: deque[int] = deque(range(num_blocks))  # the free ids in the order they are handed out
        self.live: list[list[int]] = []  # each successful alloc, minus what was freed since

    def model_allocated(self) -> set[int]:
        return {b for blocks in self.live for b in blocks}

    def snapshot(self) -> tuple[int, int]:
        return self.allocator.num_free, self.allocator.num_allocated

    @rule(n=st.integers(0, 30))
    def alloc(self, n: int) -> None:
        if n > len(self.model_free):
            before = self.snapshot()
            try:
                self.allocator.alloc(n)
            except OutOfBlocksError as err:
                assert (err.requested, err.free) == (n, len(self.model_free))
            else:
                raise AssertionError("alloc beyond the free count must raise OutOfBlocksError")
            assert self.snapshot() == before, "a failed alloc must change nothing"
            return
        blocks = self.allocator.alloc(n)
        assert len(blocks) == n and len(set(blocks)) == n, "ids within one alloc are distinct"
        assert set(blocks) <= self.model_free, f"{set(blocks) - self.model_free} handed out while in use"
        expected = [self.model_queue.popleft() for _ in range(n)]
        assert blocks == expected, f"FIFO: the free list's first {n} blocks are {expected}, got {blocks}"
        self.model_free -= set(blocks)
        self.live.append(blocks)

    @precondition(lambda self: any(self.live))
    @rule(data=st.data())
    def free_some(self, data: st.DataObject) -> None:
        """Free any subset (in any order) of one live allocation."""
        idx = data.draw(st.sampled_from([i for i, blocks in enumerate(self.live) if blocks]))
        chosen = data.draw(st.lists(st.sampled_from(self.live[idx]), min_size=1, unique=True))
        self.allocator.free(chosen)
        self.live[idx] = [b for b in self.live[idx] if b not in chosen]
        self.model_free |= set(chosen)
        self.model_queue.extend(chosen)  # to the back, in the order given

    @rule(data=st.data())
    def free_invalid(self, data: st.DataObject) -> None:
        """A free that includes a non-allocated id (or a duplicate) raises and leaves state unchanged."""
        n = self.allocator.num_blocks
        bad = data.draw(st.sampled_from(["freed", "foreign", "duplicate"]))
        allocated = sorted(self.model_allocated())
        valid = data.draw(st.lists(st.sampled_from(allocated), unique=True, max_size=3)) if allocated else []
        if bad == "freed" and self.model_free:
            wrong = [data.draw(st.sampled_from(sorted(self.model_free)))]
        elif bad == "duplicate" and allocated:
            wrong = [data.draw(st.sampled_from(allocated))] * 2
        else:
            wrong = [data.draw(st.one_of(st.integers(-5, -1), st.integers(n, n + 5)))]
        request = data.draw(st.permutations(valid + wrong))
        before = self.snapshot()
        try:
            self.allocator.free(request)
        except InvalidFreeError:
            pass
        else:
            raise AssertionError(f"free({request}) must raise InvalidFreeError")
        assert self.snapshot() == before, "a rejected free must change nothing"

    @rule()
    def drain_and_return(self) -> None:
        """Observe the allocator's free set through its public API: alloc everything that is free."""
        free = self.allocator.num_free
        got = self.allocator.alloc(free)
        assert set(got) == self.model_free, "the free set differs from the model's"
        assert got == list(self.model_queue), "the free list's order differs from the model's (FIFO)"
        self.allocator.free(got)

    @invariant()
    def no_block_lost_or_shared(self) -> None:
        if not hasattr(self, "allocator"):
            return
        n = self.allocator.num_blocks
        allocated = self.model_allocated()
        assert sum(len(b) for b in self.live) == len(allocated), "a block is live in two allocations"
        assert self.allocator.num_free + self.allocator.num_allocated == n
        assert self.allocator.num_allocated == len(allocated)
        assert self.allocator.num_free == len(self.model_free)
        assert allocated | self.model_free == set(range(n)) and not allocated & self.model_free
        assert sorted(self.model_queue) == sorted(self.model_free)


class BlockTableMachine(RuleBasedStateMachine):
    """Several block tables growing and releasing over one allocator: no slot is ever in two tables."""

    @initialize(num_blocks=st.integers(1, 16), block_size=st.sampled_from([1, 2, 4, 16]))
    def start(self, num_blocks: int, block_size: int) -> None:
        self.allocator = BlockAllocator(num_blocks)
        self.block_size = block_size
        self.tables: list[BlockTable] = []
        self.lengths: list[int] = []  # positions each table was asked to hold

    @rule()
    def new_request(self) -> None:
        self.tables.append(BlockTable(self.block_size))
        self.lengths.append(0)

    @precondition(lambda self: bool(self.tables))
    @rule(data=st.data(), grow=st.integers(1, 40))
    def reserve(self, data: st.DataObject, grow: int) -> None:
        i = data.draw(st.integers(0, len(self.tables) - 1))
        table, target = self.tables[i], self.lengths[i] + grow
        before_blocks, before_free = list(table.blocks), self.allocator.num_free
        shortfall = -(-target // self.block_size) - len(before_blocks)
        try:
            table.reserve(self.allocator, target)
        except OutOfBlocksError:
            assert shortfall > before_free
            assert table.blocks == before_blocks and self.allocator.num_free == before_free
            return
        assert table.blocks[: len(before_blocks)] == before_blocks, "held blocks never move"
        assert len(table.blocks) == -(-target // self.block_size), "exactly ceil(T / block_size) blocks"
        self.lengths[i] = target

    @precondition(lambda self: bool(self.tables))
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.tables) - 1))
        self.tables.pop(i).release(self.allocator)
        self.lengths.pop(i)

    @invariant()
    def slots_are_never_shared(self) -> None:
        if not hasattr(self, "allocator"):
            return
        slots = [s for t in self.tables for s in t.slots(0, t.capacity).tolist()]
        assert len(slots) == len(set(slots)), "a slot belongs to two requests"
        assert all(0 <= s < self.allocator.num_blocks * self.block_size for s in slots)
        held = sum(len(t.blocks) for t in self.tables)
        assert self.allocator.num_allocated == held
        assert self.allocator.num_free + held == self.allocator.num_blocks


TestAllocator = AllocatorMachine.TestCase
TestAllocator.settings = SETTINGS
TestBlockTables = BlockTableMachine.TestCase
TestBlockTables.settings = SETTINGS
