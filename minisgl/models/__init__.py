"""The model (one implementation for Qwen3, Llama, Qwen2) and its checkpoint loader."""

__lesson__ = 1

from minisgl.models.loader import CheckpointError, load_model, resolve_model_path
from minisgl.models.model import CausalLM

__all__ = ["CausalLM", "CheckpointError", "load_model", "resolve_model_path"]
