"""`SamplingParams`: how one request wants its tokens chosen and when it should stop."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    ``temperature == 0`` means greedy (argmax). ``top_k`` of -1 or 0 and ``top_p == 1`` mean
    "off". Generation stops at any of the model's EOS ids (unless ``ignore_eos``), at any id in
    ``stop_token_ids``, or after ``max_tokens`` new tokens. ``seed`` makes sampling reproducible
    for this request regardless of what else is in the batch.
    """

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` with a clear message for settings that make no sense."""
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
