"""`SamplingParams`: how one request wants its tokens chosen and when it should stop."""

from __future__ import annotations

__lesson__ = 4

import math
from dataclasses import dataclass, field

from minisgl.utils import is_int, is_number

# Below this, a positive temperature behaves as greedy. Dividing float32 logits by 1e-45 (or any
# temperature under ~1e-37) overflows to inf and the softmax turns into NaN; long before that,
# probabilities are one-hot anyway. vLLM and SGLang use the same cut-off.
MIN_TEMPERATURE = 1e-5
# The largest integer setting: the sampler holds top_k in an int64 tensor, and
# torch.Generator.manual_seed takes a 64-bit seed (any int64, as OpenAI's API allows).
MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
# The sampler works in float32, where a smaller top_p rounds to 0.
MIN_TOP_P = 1.1754943508222875e-38  # the smallest normal float32
# The most alternatives ``logprobs`` may ask for per token (OpenAI's limit, which the server's
# ``logprobs`` / ``top_logprobs`` take from here).
MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    ``temperature == 0`` means greedy (argmax); so does any temperature below
    ``MIN_TEMPERATURE`` (1e-5), which would otherwise overflow the logits. ``top_k`` of -1 or 0
    and ``top_p == 1`` mean "off". Generation stops at any of the model's EOS ids (unless
    ``ignore_eos``), at any id in ``stop_token_ids``, or after ``max_tokens`` new tokens; and
    (lesson 10) as soon as its text contains one of the ``stop`` strings, which is cut from the
    text (the token ids keep the token that completed it).
    ``seed`` (any int64, ``[-2**63, 2**63 - 1]``) makes sampling reproducible for this request
    regardless of what else is in the batch.
    ``logprobs`` asks for log-probabilities (None: off): ``0`` the chosen token's only, ``k`` in
    ``1..MAX_LOGPROBS`` (20) also the ``k`` most likely tokens at each step. They are those of
    the model's raw logits, before temperature, top-k and top-p (see
    :meth:`minisgl.engine.sampler.Sampler.logprobs`).

    Every field is checked when the object is built and again when a request is queued:
    NaN/inf, bools where numbers are meant, non-integers where integers are meant and
    out-of-range values raise ``ValueError`` naming the field.
    """

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` with the field's name for settings that make no sense."""
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not is_number(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        for name in ("top_k", "max_tokens"):
            value = getattr(self, name)
            if not is_int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_p < MIN_TOP_P:
            raise ValueError(f"top_p must be at least {MIN_TOP_P:.3g} (0 in the sampler's float32), got {self.top_p}")
        if not -1 <= self.top_k <= MAX_INT64:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or positive up to 2**63 - 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        for t in self.stop_token_ids:
            if not is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must hold non-negative integer token ids, got {t!r}")
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.seed is not None:
            if not is_int(self.seed):
                raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
            if not MIN_INT64 <= self.seed <= MAX_INT64:
                raise ValueError(f"seed must be in [-2**63, 2**63 - 1], got {self.seed}")
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None (off) or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1
