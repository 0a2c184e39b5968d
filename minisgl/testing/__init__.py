"""Test helpers: tiny HF-format checkpoints and the Hugging Face reference runner."""

from minisgl.testing.checkpoints import (
    ARCHITECTURES,
    GPU_CHECKPOINT_KWARGS,
    TEST_PROMPTS,
    build_tiny_checkpoint,
    distinct_fraction,
    tiny_checkpoint,
)
from minisgl.testing.hf_reference import HFReference
from minisgl.testing.parity import (
    ParityReport,
    TeacherForcingSampler,
    confident_disagreements,
    first_difference,
    teacher_forced_logits,
    tolerant_parity,
)

__all__ = [
    "ARCHITECTURES",
    "GPU_CHECKPOINT_KWARGS",
    "TEST_PROMPTS",
    "HFReference",
    "ParityReport",
    "TeacherForcingSampler",
    "build_tiny_checkpoint",
    "confident_disagreements",
    "distinct_fraction",
    "first_difference",
    "teacher_forced_logits",
    "tiny_checkpoint",
    "tolerant_parity",
]
