"""Test helpers: tiny HF-format checkpoints and the Hugging Face reference runner."""

from minisgl.testing.checkpoints import (
    ARCHITECTURES,
    TEST_PROMPTS,
    build_tiny_checkpoint,
    distinct_fraction,
    tiny_checkpoint,
)
from minisgl.testing.hf_reference import HFReference
from minisgl.testing.parity import ParityReport, tolerant_parity

__all__ = [
    "ARCHITECTURES",
    "TEST_PROMPTS",
    "HFReference",
    "ParityReport",
    "build_tiny_checkpoint",
    "distinct_fraction",
    "tiny_checkpoint",
    "tolerant_parity",
]
