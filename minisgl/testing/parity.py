"""Token parity in low precision: the top-2 logit-gap tolerance rule.

In bf16, two correct implementations may round differently, and where the model is nearly
undecided between its two best tokens they may pick different ones; after that the sequences
legitimately diverge. So on GPU we require our tokens to equal HF's up to (not including) the
first position where HF's top-2 logit gap is below ``tolerance``; after that nothing is
compared. A real bug changes tokens at confident positions and still fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ParityReport:
    compared: int  # how many leading tokens had to match
    first_mismatch: int | None  # index of the first differing token within `compared`, or None
    first_close_call: int | None  # first position whose top-2 gap < tolerance, or None

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None


def tolerant_parity(
    ours: Sequence[int], reference: Sequence[int], reference_logits: torch.Tensor, tolerance: float
) -> ParityReport:
    """Compare ``ours`` with ``reference`` under the top-2 gap rule (``reference_logits [N, vocab]``)."""
    top2 = reference_logits.float().topk(2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1]).tolist()
    close = next((i for i, g in enumerate(gaps) if g < tolerance), None)
    n = min(len(ours), len(reference), close if close is not None else len(reference))
    mismatch = next((i for i in range(n) if ours[i] != reference[i]), None)
    if mismatch is None and close is None and len(ours) != len(reference):
        mismatch = n
    return ParityReport(compared=n, first_mismatch=mismatch, first_close_call=close)
