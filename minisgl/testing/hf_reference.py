"""The yardstick: what Hugging Face `transformers` generates for the same checkpoint."""

from __future__ import annotations

__lesson__ = 'tooling'

import functools
from collections.abc import Sequence
from pathlib import Path

import torch


@functools.cache
def _load(path: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    # `generate` fills unset fields from the model's own generation config, EOS ids included;
    # clear them so that "no stop tokens" really means never stopping early (ignore_eos).
    model.generation_config.eos_token_id = None
    return model


class HFReference:
    """Greedy generation and logits from `transformers` (models cached per process)."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        self.model = _load(str(path), dtype, device)
        self.device = device

    @torch.inference_mode()
    def greedy(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int] | None = None) -> list[int]:
        """Greedy new tokens for one prompt (run alone, batch of 1).

        ``stop_token_ids=None`` never stops early (the ``ignore_eos`` setting); otherwise the
        generation ends after the first stop token, which is included in the result.
        """
        from transformers import GenerationConfig

        config = GenerationConfig(
            do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=list(stop_token_ids) if stop_token_ids else None,
            pad_token_id=0,
        )
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return out[0, ids.shape[1]:].tolist()

    @torch.inference_mode()
    def greedy_with_logits(self, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
        """Greedy tokens (never stopping early) and the ``[max_new_tokens, vocab]`` float32 logits that chose them."""
        from transformers import GenerationConfig

        config = GenerationConfig(
            do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0,
            output_logits=True, return_dict_in_generate=True,
        )
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        return tokens, torch.stack([step[0].float() for step in out.logits])

    @torch.inference_mode()
    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``[T, vocab]`` float32 logits of a full-sequence forward."""
        ids = torch.tensor([list(token_ids)], device=self.device)
        return self.model(ids).logits[0].float()


@functools.cache
def hf_greedy_tokens(arch: str, prompt: tuple[int, ...], max_new_tokens: int,
                     stop_token_ids: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """HF's greedy tokens for ``prompt`` alone on the tiny ``arch`` test checkpoint, float32 on the
    CPU, computed once per process (``stop_token_ids=None`` never stops early)."""
    from minisgl.testing.checkpoints import tiny_checkpoint

    return tuple(HFReference(tiny_checkpoint(arch)).greedy(list(prompt), max_new_tokens, stop_token_ids=stop_token_ids))
