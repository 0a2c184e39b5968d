"""Tokenizer loading and prompt rendering (plain text, chat messages or token ids)."""

from __future__ import annotations

import os
from typing import Any, Literal, Sequence, Union

from minisgl.models.loader import resolve_model_path
from minisgl.utils import is_int

ChatMessages = Sequence[dict[str, Any]]
Prompt = Union[str, ChatMessages, Sequence[int]]
PromptKind = Literal["text", "chat", "token_ids"]


def prompt_kind(prompt: Any) -> PromptKind | None:
    """What one prompt is: ``"text"``, ``"chat"`` (a non-empty list of message dicts),
    ``"token_ids"`` (a non-empty list of ints, bools excluded), or ``None`` if it is none of them
    (e.g. a list of prompts, or an empty list)."""
    if isinstance(prompt, str):
        return "text"
    if isinstance(prompt, (list, tuple)) and len(prompt) > 0:
        if all(is_int(t) for t in prompt):  # bools excluded: True is not token 1
            return "token_ids"
        if all(isinstance(m, dict) for m in prompt):
            return "chat"
    return None


def load_tokenizer(model: str | os.PathLike):
    """The checkpoint's Hugging Face tokenizer (fast, from tokenizer.json)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_path(model)))


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids for a text prompt, a chat (list of ``{"role", "content"}``) or ids given as is."""
    kind = prompt_kind(prompt)
    if kind == "text":
        return list(tokenizer.encode(prompt))
    if kind == "token_ids":
        return [int(t) for t in prompt]  # type: ignore[union-attr]
    if kind == "chat":
        ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    raise TypeError(
        "a prompt is a string, a list of chat messages, or a non-empty list of integer token ids; "
        f"got {type(prompt).__name__} {str(prompt)[:80]!r}"
    )
