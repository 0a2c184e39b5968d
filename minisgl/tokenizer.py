"""Tokenizer loading and prompt rendering (plain text, chat messages or token ids)."""

from __future__ import annotations

import os
from typing import Any, Sequence, Union

from minisgl.models.loader import resolve_model_path

ChatMessages = Sequence[dict[str, Any]]
Prompt = Union[str, ChatMessages, Sequence[int]]


def load_tokenizer(model: str | os.PathLike):
    """The checkpoint's Hugging Face tokenizer (fast, from tokenizer.json)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_path(model)))


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids for a text prompt, a chat (list of ``{"role", "content"}``) or ids given as is."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    if len(prompt) > 0 and all(isinstance(t, int) for t in prompt):
        return list(prompt)  # type: ignore[arg-type]
    if len(prompt) > 0 and all(isinstance(m, dict) for m in prompt):
        ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    raise TypeError("a prompt is a string, a list of chat messages, or a non-empty list of token ids")
