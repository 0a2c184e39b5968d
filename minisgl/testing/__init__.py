"""Test helpers: tiny HF-format checkpoints and the Hugging Face reference runner."""

__lesson__ = 'tooling'

from minisgl.testing.checkpoints import (
    ARCHITECTURES,
    GPU_CHECKPOINT_KWARGS,
    MOE_ARCHITECTURES,
    SPARSE_MOE_KWARGS,
    TEST_PROMPTS,
    build_tiny_checkpoint,
    build_tiny_tokenizer,
    distinct_fraction,
    draft_checkpoint,
    expert_usage,
    multi_file_checkpoint,
    stack_experts,
    tiny_checkpoint,
    tiny_model,
    tiny_tokenizer,
)
from minisgl.testing.hf_reference import HFReference, hf_greedy_tokens
from minisgl.testing.parity import (
    LOGIT_GAP_TOLERANCE,
    ParityReport,
    TeacherForcingSampler,
    confident_disagreements,
    first_difference,
    teacher_forced_logits,
    tolerant_parity,
)
from minisgl.testing.processes import process_alive

__all__ = [
    "ARCHITECTURES",
    "GPU_CHECKPOINT_KWARGS",
    "TEST_PROMPTS",
    "HFReference",
    "LOGIT_GAP_TOLERANCE",
    "MOE_ARCHITECTURES",
    "SPARSE_MOE_KWARGS",
    "ParityReport",
    "TeacherForcingSampler",
    "build_tiny_checkpoint",
    "build_tiny_tokenizer",
    "confident_disagreements",
    "distinct_fraction",
    "draft_checkpoint",
    "expert_usage",
    "first_difference",
    "hf_greedy_tokens",
    "multi_file_checkpoint",
    "process_alive",
    "stack_experts",
    "teacher_forced_logits",
    "tiny_checkpoint",
    "tiny_tokenizer",
    "tiny_model",
    "tolerant_parity",
]
