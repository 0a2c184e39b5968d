"""Lesson 7: host-to-device copies through pinned staging buffers that are never reused too early.

With overlap scheduling the host builds batch N+1 while the device still runs batch N. The
small index tensors of a batch (input ids, positions, ...) reach the device through an
asynchronous copy from page-locked ("pinned") host memory: ``copy(non_blocking=True)`` only
*enqueues* the copy, and the device reads the pinned buffer whenever the stream gets there. If
the host writes the next batch into the same buffer before that, batch N silently runs with
batch N+1's indices. (This is the race SGLang's anchors hit with FlashInfer's ``plan()``.)

:class:`PinnedStaging` makes it impossible: a ring of buffers, each with an event recorded
right after its copy was enqueued; a buffer is written again only after its event has
completed. On the CPU there is no asynchronous copy, but the same ring and the same guard run,
so the discipline is tested on a laptop (a test substitutes a deferred copy to show the race).
"""

from __future__ import annotations

__lesson__ = 7

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Slot:
    buffer: torch.Tensor  # [capacity] int64 host staging (pinned on CUDA)
    copy_done: Any = None  # an event recorded after the last copy out of ``buffer``; None: free


class PinnedStaging:
    """Copies lists of small int tensors to ``device`` in one transfer, through a ring of
    ``num_slots`` staging buffers; a buffer is reused only after its previous copy completed."""

    def __init__(self, device: torch.device | str, num_slots: int = 2, capacity: int = 1 << 16) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.slots = [_Slot(self._alloc(capacity)) for _ in range(num_slots)]
        self._next = 0
        self.guarded_reuses = 0  # reuses of a slot that went through the guard (for tests)

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.int64, pin_memory=self.pinned)

    # The two device-specific operations; a test overrides them with a deferred copy.
    def _copy(self, src: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Start copying ``src`` (a staging view) to the device; return the destination and an
        event that completes when the source may be overwritten (None: already complete)."""
        if not self.pinned:
            return src.clone(), None
        dst = src.to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return dst, done

    def _wait(self, event: Any) -> None:
        event.synchronize()

    def to_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` (1-D, integer, on the host) as int64 device tensors, copied in one go."""
        sizes = [t.numel() for t in tensors]
        total = sum(sizes)
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        if slot.copy_done is not None:  # the guard: never write a buffer whose copy may be pending
            self._wait(slot.copy_done)
            self.guarded_reuses += 1
            slot.copy_done = None
        if slot.buffer.numel() < total:
            slot.buffer = self._alloc(max(total, 2 * slot.buffer.numel()))
        staged = slot.buffer[:total]
        if total:
            torch.cat([t.reshape(-1).to(torch.int64) for t in tensors], out=staged)
        dst, slot.copy_done = self._copy(staged)
        return list(dst.split(sizes))
