"""Tokenizer loading and prompt rendering (plain text, chat messages or token ids)."""

from __future__ import annotations

__lesson__ = 1

import os
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from minisgl.model_path import resolve_model_path
from minisgl.utils import is_int

ChatMessages = Sequence[dict[str, Any]]
Prompt = str | ChatMessages | Sequence[int]
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


# ChatML, the chat format of Qwen models: each turn is ``<|im_start|>role\ncontent<|im_end|>\n``, and
# the generation prompt opens the assistant's turn.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str]):
    """A byte-level BPE (`tokenizers.Tokenizer`) trained on ``texts``, the GPT-2/Qwen style of
    tokenizer: any byte sequence is encodable, ``special_tokens`` take the first ids (0, 1, ...)
    in the order given, and training is deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_hf_tokenizer(
    tok, out: str | os.PathLike, *, eos: str, pad: str, chat_template: str, bos: str | None = None
) -> None:
    """Write ``tok`` as Hugging Face tokenizer files (``tokenizer.json``, ``tokenizer_config.json``
    with the chat template) into the checkpoint directory ``out``."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos, pad_token=pad)
    fast.chat_template = chat_template
    fast.save_pretrained(str(out))
