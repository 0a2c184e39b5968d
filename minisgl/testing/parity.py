"""Token parity in low precision: the top-2 logit-gap tolerance rule.

In bf16, two correct implementations may round differently, and where the model is nearly
undecided between its two best tokens they may pick different ones; after that the sequences
legitimately diverge. So on GPU we require our tokens to equal HF's up to (not including) the
first position where HF's top-2 logit gap is below ``tolerance``; after that nothing is
compared. A real bug changes tokens at confident positions and still fails.
"""

from __future__ import annotations

__lesson__ = 'tooling'

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.engine.sampler import Logprobs, Sampler

# The tolerance of the rule for bf16 on the GPU test model: HF's own bf16 logits differ from its
# float32 logits by up to ~0.24 there (measured, lessons/l03/README.md "Pitfall: bf16 parity
# needs a well-conditioned test model"), so two correct bf16 implementations may flip a top-2
# pair closer than about twice that.
LOGIT_GAP_TOLERANCE = 0.5

if TYPE_CHECKING:
    from minisgl.generate import SequenceKV
    from minisgl.models.model import CausalLM


def first_difference(ours: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first token where two generations differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            return i
    return None if len(ours) == len(reference) else min(len(ours), len(reference))


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


@torch.inference_mode()
def teacher_forced_logits(model: CausalLM, kv: SequenceKV, prompt_ids: Sequence[int], forced: Sequence[int]) -> torch.Tensor:
    """Our ``[len(forced), vocab]`` logits when the sequence is forced to ``prompt + forced``.

    Runs a prefill of the prompt, then one decode step per forced token, exactly like greedy
    generation except that the next input is the reference's token, not ours. So every
    position can be compared with the reference, even after a legitimate close-call divergence.
    """
    device = next(model.parameters()).device
    rows = []
    step_ids = list(prompt_ids)
    cached = 0
    for i in range(len(forced)):
        backend = kv.prepare(cached, len(step_ids))
        ids = torch.tensor(step_ids, device=device)
        pos = torch.arange(cached, cached + len(step_ids), device=device)
        rows.append(model(ids, pos, backend, logits_indices=torch.tensor([len(step_ids) - 1], device=device))[0])
        cached += len(step_ids)
        step_ids = [forced[i]]
    kv.release()
    return torch.stack(rows)


def confident_disagreements(ours_logits: torch.Tensor, reference_logits: torch.Tensor, tolerance: float) -> tuple[int, list[int]]:
    """Positions where the reference is confident (top-2 gap >= tolerance) but our argmax differs.

    Returns ``(number_of_confident_positions, [mismatching positions])``.
    """
    top2 = reference_logits.float().cpu().topk(2, dim=-1)
    confident = (top2.values[:, 0] - top2.values[:, 1]) >= tolerance
    wrong = confident & (ours_logits.float().cpu().argmax(dim=-1) != top2.indices[:, 0])
    return int(confident.sum()), wrong.nonzero().flatten().tolist()


class TeacherForcingSampler:
    """A stand-in for the engine's sampler that feeds each request the reference's tokens.

    ``forced[tuple(prompt_ids)]`` lists the reference's tokens for that prompt. Every time the
    engine samples for a request, this records the engine's logits row at that output position
    and returns the reference's token instead of ours, so the engine keeps running on the
    reference's sequence: batched prefills *and decode steps* (and anything the scheduler does
    between them, such as prefix-cache hits or retraction) are all compared at every position,
    not only until the first close call. ``logits(prompt)`` stacks what was recorded:
    ``[len(forced[prompt]), vocab]`` float32 on the CPU.
    """

    def __init__(self, forced: dict[tuple[int, ...], Sequence[int]]) -> None:
        self.forced = {k: list(v) for k, v in forced.items()}
        self.rows: dict[tuple[int, ...], dict[int, torch.Tensor]] = {k: {} for k in forced}

    def __call__(self, logits: torch.Tensor, reqs: Sequence) -> list[int]:
        tokens = []
        for row, req in zip(logits, reqs):
            # The output position being sampled. A launched batch has already counted this token
            # as pending (lesson 7), and with overlap one earlier token may be pending too.
            key, k = tuple(req.prompt_ids), len(req.output_ids) + max(req.pending - 1, 0)
            self.rows[key][k] = row.float().cpu()
            tokens.append(self.forced[key][k])
        return tokens

    def sample(self, logits: torch.Tensor, reqs: Sequence) -> torch.Tensor:
        """The engine's entry point (lesson 7): the tokens as a tensor on the logits' device."""
        return torch.tensor(self(logits, reqs), dtype=torch.int64, device=logits.device)

    def logprobs(self, logits: torch.Tensor, reqs: Sequence, tokens: torch.Tensor) -> Logprobs | None:
        """The engine's other entry point: the package's log-probabilities of the forced tokens."""
        return Sampler().logprobs(logits, reqs, tokens)

    def logits(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        rows = self.rows[tuple(prompt_ids)]
        assert sorted(rows) == list(range(len(rows))), "a position was sampled twice or skipped"
        return torch.stack([rows[k] for k in range(len(rows))])


FORCED_ENV = "MINISGL_TEST_FORCED"  # a JSON file: prompts, the reference's tokens, where rank 0 saves its logits


def force_reference_tokens(rank: int) -> None:
    """``rank_init`` of the multi-GPU parity tests (``LLM(..., rank_init="minisgl.testing.parity:
    force_reference_tokens")``, lessons 9 and 11): every rank's engine samples the reference's
    tokens through a :class:`TeacherForcingSampler`; rank 0 saves its logits (``torch.save``, one
    ``[n, vocab]`` tensor per prompt) as soon as every position of every prompt has been sampled.
    Reads the JSON file named by ``$MINISGL_TEST_FORCED``: ``prompts``, ``tokens``, ``out``."""
    import json
    import os

    from minisgl.engine import engine as engine_module

    with open(os.environ[FORCED_ENV]) as f:
        spec = json.load(f)
    forcing = TeacherForcingSampler({tuple(p): t for p, t in zip(spec["prompts"], spec["tokens"])})
    original = engine_module.Engine.__init__

    def init(self, model, backend, sampler=None, **kwargs):
        original(self, model, backend, sampler=forcing, **kwargs)

    engine_module.Engine.__init__ = init
    sample = forcing.sample

    def sample_and_save(logits, reqs):
        tokens = sample(logits, reqs)
        if rank == 0 and all(len(forcing.rows[tuple(p)]) == len(t) for p, t in zip(spec["prompts"], spec["tokens"])):
            torch.save([forcing.logits(p) for p in spec["prompts"]], spec["out"])
        return tokens

    forcing.sample = sample_and_save
