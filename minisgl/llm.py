"""The offline API: ``LLM(model).generate(prompts, sampling_params)``.

    from minisgl import LLM, SamplingParams
    llm = LLM("Qwen/Qwen3-0.6B")            # or a local checkpoint directory
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    print(outs[0].text)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch
from tqdm.auto import tqdm

from minisgl.attention.paged import make_paged_backend
from minisgl.config import ModelConfig
from minisgl.engine.engine import Engine
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.kvcache.sizing import num_blocks_for_budget
from minisgl.models.loader import load_model, resolve_model_path
from minisgl.sampling_params import SamplingParams
from minisgl.core import Req
from minisgl.scheduler.scheduler import Scheduler, SchedulerConfig
from minisgl.tokenizer import Prompt, encode_prompt, load_tokenizer


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class LLM:
    """A model, its tokenizer and a continuous-batching scheduler, driven offline.

    Precision: float32 on the CPU (exact parity with HF); on CUDA the checkpoint's bf16/fp16,
    or bf16 for float32 checkpoints. KV pool size: ``num_pages`` if given; on CUDA otherwise
    ``kv_memory_fraction`` of the GPU memory still free after loading the model; on CPU
    ``cpu_kv_bytes`` (default 2 GiB).
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        page_size: int = 16,
        num_pages: int | None = None,
        max_running: int = 256,
        max_prefill_tokens: int = 8192,
        max_seq_len: int | None = None,
        kv_memory_fraction: float = 0.8,
        cpu_kv_bytes: int = 2 << 30,
        attention_backend: str = "auto",
        dummy_weights: bool = False,
    ) -> None:
        self.device = device or default_device()
        path = resolve_model_path(model)
        if dtype is None:
            checkpoint_dtype = ModelConfig.from_dir(path).dtype
            if self.device == "cpu":
                dtype = torch.float32  # CPU: exact parity with HF in float32
            else:  # GPU kernels want 16-bit: keep bf16/fp16 checkpoints, run float32 ones in bf16
                dtype = checkpoint_dtype if checkpoint_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        self.model = load_model(path, dtype=dtype, device=self.device, dummy_weights=dummy_weights)
        self.config = self.model.config
        self.tokenizer = load_tokenizer(path)
        self.dtype = next(self.model.parameters()).dtype
        max_seq_len = max_seq_len or self.config.max_position_embeddings
        if num_pages is None:
            if self.device.startswith("cuda"):
                free, _ = torch.cuda.mem_get_info()
                budget = int(free * kv_memory_fraction)
            else:
                budget = cpu_kv_bytes
            num_pages = num_blocks_for_budget(self.config, budget, page_size, self.dtype)
        if num_pages < 1:
            raise ValueError("no memory left for the KV cache")
        self.pool = PagedKVPool.for_model(self.config, num_pages, page_size, self.dtype, self.device)
        backend = make_paged_backend(self.pool, self.config.num_heads, attention_backend)
        self.engine = Engine(self.model, backend)
        self.scheduler = Scheduler(
            self.engine,
            SchedulerConfig(num_pages, page_size, max_running, max_prefill_tokens, max_seq_len),
            eos_token_ids=self.config.eos_token_ids,
            vocab_size=self.config.vocab_size,
        )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = True,
    ) -> list[GenerationOutput]:
        """Generate for each prompt (text, chat messages, or token ids); outputs in input order."""
        if isinstance(prompts, str) or _is_single_token_list(prompts) or _is_single_chat(prompts):
            prompts = [prompts]  # one prompt given bare
        params = sampling_params or SamplingParams()
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        reqs: list[Req] = []
        try:
            for prompt, p in zip(prompts, params_list):
                reqs.append(self.scheduler.add_request(encode_prompt(self.tokenizer, prompt), p))
        except Exception:
            for r in reqs:  # all-or-nothing: a bad prompt leaves nothing behind
                self.scheduler.abort(r)
            raise
        bar = tqdm(total=len(reqs), desc="generating", disable=not progress, unit="req")
        pending = set(map(id, reqs))
        while pending:
            for req in self.scheduler.step():
                if id(req) in pending:
                    pending.discard(id(req))
                    bar.update(1)
        bar.close()
        return [
            GenerationOutput(r.prompt_ids, r.output_ids, self.tokenizer.decode(r.output_ids, skip_special_tokens=True),
                             r.finish_reason or "abort")
            for r in reqs
        ]


def _is_single_token_list(p) -> bool:
    return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(t, int) for t in p)


def _is_single_chat(p) -> bool:
    return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(m, dict) for m in p)
