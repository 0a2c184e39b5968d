"""Lesson 4: the offline API, ``LLM(model).generate(prompts, sampling_params)``.

    from minisgl import LLM, SamplingParams
    llm = LLM("Qwen/Qwen3-0.6B")            # or a local checkpoint directory, or "demo"
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    print(outs[0].text)

A thin front: it checks the settings (:class:`~minisgl.engine.config.EngineConfig`), has the
builder make an engine, and turns prompts (text, chat messages or token ids) into requests.
"""

from __future__ import annotations

__lesson__ = 4

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from minisgl.engine.builder import build
from minisgl.engine.config import config_from, default_device
from minisgl.engine.local import GenerationOutput, LocalEngine, RequestFailedError
from minisgl.sampling_params import SamplingParams
from minisgl.tokenizer import Prompt, encode_prompt, prompt_kind

if TYPE_CHECKING:
    from minisgl.distributed.client import RankClient  # lesson 9's front, built by the builder

__all__ = ["LLM", "GenerationOutput", "RequestFailedError", "default_device"]


class LLM:
    """A model, its tokenizer and a continuous-batching scheduler, driven offline.

    ``settings`` are the fields of :class:`~minisgl.engine.config.EngineConfig` (page size, pool
    size, ``max_running``, ``prefix_cache``, ``chunked_prefill_size``, ``overlap``,
    ``cuda_graph_max_bs``, ``tp_size``, ...), each checked before the model loads: a bad one
    raises ``ValueError`` naming it. Precision: float32 on the CPU (exact parity with HF), 16-bit
    on CUDA. With ``tp_size > 1`` (lesson 9) the model runs in that many rank processes,
    stopped by ``close()`` (or a ``with`` block, or when the ``LLM`` is collected); this process
    keeps only the tokenizer.
    """

    def __init__(self, model: str | os.PathLike, **settings) -> None:
        self._attach(build(model, config_from(settings)))

    @classmethod
    def over(cls, core: LocalEngine | RankClient) -> LLM:
        """The front over an engine already built (e.g. a tensor-parallel rank's own slice)."""
        llm = cls.__new__(cls)
        llm._attach(core)
        return llm

    def _attach(self, core: LocalEngine | RankClient) -> None:
        self.core = core
        self.engine_config = core.engine_config  # every setting, resolved (device, dtype, ...)
        self.model_path = core.path  # the checkpoint directory ("demo" and hub ids resolved)
        self.config = core.model_config
        self.tp_size = core.engine_config.tp_size
        self.device = core.device
        self.max_seq_len = core.max_seq_len  # prompt + max_tokens of one request, at most
        self.page_size, self.num_pages = core.page_size, core.num_pages

    @property
    def tokenizer(self):
        """The model's tokenizer (a Hugging Face tokenizer), loaded when first needed."""
        return self.core.tokenizer

    # In this process (tp_size == 1): the parts the builder made, for tests and notebooks.
    @property
    def local(self) -> LocalEngine:
        if not isinstance(self.core, LocalEngine):
            raise AttributeError("with tp_size > 1 the engine runs in the rank processes (see LLM.core)")
        return self.core

    @property
    def model(self):
        return self.local.model

    @property
    def dtype(self) -> torch.dtype:
        return self.local.dtype

    @property
    def pool(self):
        return self.local.pool

    @property
    def engine(self):
        return self.local.engine

    @property
    def scheduler(self):
        return self.local.scheduler

    @property
    def graph_memory(self):
        """GPU memory lesson 8's graph runner takes (buffers, graphs; measured on CUDA)."""
        return self.local.graph_memory

    @property
    def graph_memory_bytes(self) -> int:
        """The same in bytes; 0 without CUDA graphs (lesson 8 off)."""
        return self.local.graph_memory.total if self.local.graph_memory is not None else 0

    def close(self) -> None:
        """Stop the rank processes (tensor parallelism); nothing to do for one process."""
        core = getattr(self, "core", None)
        if core is not None:
            core.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = True,
    ) -> list[GenerationOutput]:
        """Generate for each prompt (text, chat messages, or token ids); outputs in input order.

        All or nothing: a bad prompt or setting raises before anything runs; a request that
        fails while running raises :class:`RequestFailedError`; an interrupt (Ctrl-C) propagates.
        In every case the requests of this call are aborted and their KV freed first, so the
        ``LLM`` is ready (and correct) for the next call.
        """
        if prompt_kind(prompts) is not None:
            prompts = [prompts]  # one prompt given bare
        params = SamplingParams() if sampling_params is None else sampling_params
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        for p in params_list:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        return self.core.generate(prompt_ids, params_list, progress=progress)
