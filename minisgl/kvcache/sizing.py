"""How many tokens (and pages) of KV fit in a memory budget.

The bytes one token costs come from :meth:`minisgl.config.ModelConfig.kv_bytes_per_token`:
2 (K and V) x H_kv x D x layers x bytes per element; Qwen3-0.6B in bf16: 114,688 B = 112 KiB.
"""

from __future__ import annotations

__lesson__ = 3

import torch

from minisgl.config import ModelConfig


def num_slots_for_budget(config: ModelConfig, budget_bytes: int, dtype: torch.dtype) -> int:
    """Token slots that fit in ``budget_bytes`` of KV memory."""
    return budget_bytes // config.kv_bytes_per_token(dtype)


def num_blocks_for_budget(config: ModelConfig, budget_bytes: int, block_size: int, dtype: torch.dtype) -> int:
    """Whole blocks (pages) of ``block_size`` tokens that fit in ``budget_bytes``."""
    return num_slots_for_budget(config, budget_bytes, dtype) // block_size
