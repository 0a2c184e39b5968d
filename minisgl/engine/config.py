"""Lesson 4: `EngineConfig`, every setting of the engine in one place.

``LLM(model, **settings)``, the flags of ``python -m minisgl``, the tensor-parallel rank
processes (which receive it whole) and the scheduler all read this one frozen dataclass. Each
field carries its default, its meaning (``help``, also the command line's) and the lesson that
introduces it; :meth:`EngineConfig.__post_init__` is the only place a setting is validated.

A few settings default to ``None`` ("decide from the machine and the model"); the builder
fills them in with :meth:`EngineConfig.resolve` once the device and the model's context length
are known, so everything below the builder reads concrete values.

This module does not import torch at its top, nor the attention package (which does): the
server's API process (``python -m minisgl``, lesson 10) checks its flags with
:class:`EngineConfig` before it starts any other process, and it never runs a model, so it
should not pay torch's import (over a second of CPU) on every start. The dtypes are therefore
named here (:data:`DTYPE_NAMES`) and become torch dtypes in :func:`torch_dtypes`, which imports
torch when a dtype is actually given; a device is checked by its name; the attention backends
are named in :data:`ATTENTION_BACKENDS`. ``tests/test_process_imports.py`` checks that the
API process's modules leave torch unloaded.
"""

from __future__ import annotations

__lesson__ = 4

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minisgl.utils import is_int, is_number

if TYPE_CHECKING:  # imported where a value needs it (see the module's docstring)
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the dtypes the engine runs in
# The names minisgl.attention.factory.make_paged_backend accepts (lesson 3), as plain text:
# importing them from there would import torch. tests/test_process_imports.py checks that they agree.
ATTENTION_BACKENDS = ("auto", "reference", "torch", "flashinfer", "triton")
# A device name torch.device() reads as a CPU or CUDA device: "cpu", "cuda", "cuda:1", ...
_CPU_OR_CUDA = re.compile(r"(cpu|cuda)(:(0|[1-9][0-9]*))?")


def torch_dtypes() -> dict[str, torch.dtype]:
    """:data:`DTYPE_NAMES` as torch dtypes (``{"float32": torch.float32, ...}``). It imports
    torch: only a config that is given a dtype needs it."""
    import torch

    return {name: getattr(torch, name) for name in DTYPE_NAMES}


def is_cpu_or_cuda(device: Any) -> bool:
    """Whether ``torch.device(device)`` is a CPU or CUDA device. A name is read as torch reads
    it, without torch (the API process checks ``--device`` torch-free); anything else (a
    ``torch.device``, whose owner has loaded torch already) is asked of torch itself."""
    if isinstance(device, str):
        return _CPU_OR_CUDA.fullmatch(device) is not None
    import torch

    try:
        return torch.device(device).type in ("cpu", "cuda")
    except (RuntimeError, TypeError):
        return False


def setting(default: Any, help: str, lesson: int, flag: bool = True) -> Any:
    """A field of :class:`EngineConfig`: its default, what it means, the lesson that adds it,
    and whether ``python -m minisgl`` offers it as a flag."""
    return field(default=default, metadata={"help": help, "lesson": lesson, "flag": flag})


@dataclass(frozen=True)
class EngineConfig:
    """Every engine setting. Build with keywords; a bad value raises ``ValueError`` naming it."""

    device: str | None = setting(None, "cpu or cuda (default: cuda if available)", 4)
    dtype: torch.dtype | None = setting(
        None, "float32, bfloat16 or float16 (default: float32 on the CPU, the checkpoint's 16-bit type or bfloat16 on CUDA)", 4)
    page_size: int = setting(16, "tokens per KV page", 4)
    num_pages: int | None = setting(None, "KV pages in the pool (default: sized from memory)", 4)
    max_running: int = setting(256, "most requests in a batch (the largest decode batch)", 4)
    max_prefill_tokens: int = setting(8192, "prompt tokens admitted per prefill step (whole prompts, lesson 4)", 4)
    max_seq_len: int | None = setting(None, "prompt + max_tokens limit of one request (default: the model's context)", 4)
    kv_memory_fraction: float = setting(0.8, "CUDA: share of the GPU memory left after the model that the KV pool takes", 4)
    cpu_kv_bytes: int = setting(2 << 30, "CPU: most bytes the KV pool may take", 4)
    attention_backend: str = setting("auto", "auto, reference, torch, flashinfer or triton", 4)
    dummy_weights: bool = setting(False, "random weights of the checkpoint's shape (benchmarks)", 4)
    cpu_threads: int | None = setting(
        None, "CPU runs: torch threads per process (default: 1, unless MINISGL_CPU_THREADS or OMP_NUM_THREADS says; "
        "see minisgl.cpu_threads)", 4)
    prefix_cache: bool = setting(True, "share prompt prefixes through a radix cache", 5)
    chunked_prefill_size: int | None = setting(
        8192, "token budget per step: decode tokens, new prompts and chunks of long ones (0 or None: whole prompts)", 6)
    overlap: bool = setting(True, "overlap scheduling: launch step N+1 before processing step N", 7)
    cuda_graph_max_bs: int | None = setting(
        None, "largest decode batch run through CUDA graphs (default: 256 on CUDA, 0 on the CPU; 0: off)", 8)
    tp_size: int = setting(1, "tensor-parallel ranks: one process per rank, one GPU each", 9)
    tp_all_reduce: str = setting(
        "auto", "auto (symmetric memory for small all-reduces where GPUs reach each other, each fused with the "
        "residual add and RMSNorm after it), symmetric (the same without the fusion) or nccl", 9)
    ep_size: int = setting(
        1, "mixture-of-experts models: 1 (each rank holds a slice of every expert) or tp_size (expert parallelism: "
        "each rank holds num_experts / tp_size whole experts)", 11)
    rank_init: str | None = setting(None, "'module:function' called in every rank before its model is built (tests)", 9,
                                    flag=False)
    speculative: str | None = setting(
        None, "speculative decoding: None (off), ngram (draft tokens looked up in the request's own earlier tokens) "
        "or draft (drafted by draft_model); runs without overlap scheduling and CUDA graphs", 12)
    num_speculative_tokens: int = setting(4, "speculative decoding: most draft tokens per request and step (k)", 12)
    draft_model: str | None = setting(
        None, "speculative='draft': the draft model, a checkpoint directory, hub id or 'demo-draft' (the demo's); "
        "it must share the model's tokenizer", 12)

    def __post_init__(self) -> None:
        def fail(name: str, expected: str) -> None:
            raise ValueError(f"EngineConfig.{name} must be {expected}, got {getattr(self, name)!r}")

        if isinstance(self.dtype, str):  # "bfloat16" (the command line, a rank's JSON) -> torch.bfloat16
            if self.dtype.replace("torch.", "") not in DTYPE_NAMES:
                fail("dtype", f"None or one of {sorted(DTYPE_NAMES)}")
            object.__setattr__(self, "dtype", torch_dtypes()[self.dtype.replace("torch.", "")])
        if self.dtype is not None and self.dtype not in torch_dtypes().values():
            fail("dtype", "None, torch.float32, torch.bfloat16 or torch.float16")
        if self.device is not None and not is_cpu_or_cuda(self.device):
            fail("device", "None or a CPU or CUDA device")
        for name in ("page_size", "max_running", "max_prefill_tokens", "cpu_kv_bytes", "tp_size", "ep_size"):
            if not (is_int(getattr(self, name)) and getattr(self, name) >= 1):
                fail(name, "an integer >= 1")
        if self.chunked_prefill_size == 0 and is_int(self.chunked_prefill_size):
            object.__setattr__(self, "chunked_prefill_size", None)  # 0 on the command line: whole prompts
        for name in ("num_pages", "max_seq_len", "chunked_prefill_size", "cpu_threads"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 1):
                fail(name, "None or an integer >= 1")
        if self.cuda_graph_max_bs is not None and not (is_int(self.cuda_graph_max_bs) and self.cuda_graph_max_bs >= 0):
            fail("cuda_graph_max_bs", "None or an integer >= 0 (0: no CUDA graphs)")
        if not is_number(self.kv_memory_fraction) or not 0 < self.kv_memory_fraction <= 1:
            fail("kv_memory_fraction", "a number in (0, 1]")
        if self.attention_backend not in ATTENTION_BACKENDS:
            fail("attention_backend", f"one of {ATTENTION_BACKENDS}")
        if self.ep_size not in (1, self.tp_size):  # lesson 11: the experts are split over the TP ranks, or not at all
            fail("ep_size", f"1 or tp_size ({self.tp_size})")
        if self.tp_all_reduce not in ("auto", "symmetric", "nccl"):
            fail("tp_all_reduce", "'auto', 'symmetric' or 'nccl'")
        for name in ("prefix_cache", "overlap", "dummy_weights"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "True or False")
        if self.rank_init is not None and (not isinstance(self.rank_init, str) or ":" not in self.rank_init):
            fail("rank_init", "None or 'module:function'")
        if isinstance(self.draft_model, os.PathLike):
            object.__setattr__(self, "draft_model", os.fspath(self.draft_model))
        if self.speculative not in (None, "ngram", "draft"):
            fail("speculative", "None, 'ngram' or 'draft'")
        if self.speculative == "draft" and not (isinstance(self.draft_model, str) and self.draft_model):
            raise ValueError("EngineConfig.speculative='draft' needs draft_model (a checkpoint directory, hub id "
                             "or 'demo-draft')")
        if self.draft_model is not None and self.speculative != "draft":
            raise ValueError(f"EngineConfig.draft_model={self.draft_model!r} is used only with speculative='draft', "
                             f"got speculative={self.speculative!r}")
        if not (is_int(self.num_speculative_tokens) and self.num_speculative_tokens >= 1):
            fail("num_speculative_tokens", "an integer >= 1")
        if self.speculative and self.cuda_graph_max_bs:  # lesson 12: graphs replay one-token decode rows
            raise ValueError(f"EngineConfig.cuda_graph_max_bs={self.cuda_graph_max_bs}: speculative decoding runs its "
                             "verify steps eagerly (a captured graph holds one-token decode rows); pass "
                             "cuda_graph_max_bs=0 (or leave it unset)")

    def resolve(self, context_len: int, cuda_available: bool | None = None) -> EngineConfig:
        """The settings with every "decide later" filled in, for a model of ``context_len``
        positions: the device (CUDA if available), the dtype (float32 on the CPU: exact parity
        with HF), ``max_seq_len`` (the context; never more) and ``cuda_graph_max_bs`` (256 on
        CUDA, 0 on the CPU, never more than ``max_running``). With ``speculative`` (lesson 12),
        ``overlap`` and ``cuda_graph_max_bs`` become off: the lagged loop would plan the next step
        before it knows how many tokens the last one accepted, and a graph holds one-token rows."""
        if cuda_available is None:
            cuda_available = default_device() == "cuda"
        device = self.device or ("cuda" if cuda_available else "cpu")  # (default_device, for this answer)
        if device.startswith("cuda") and not cuda_available:
            raise ValueError(f"EngineConfig.device={device!r} but CUDA is not available on this machine")
        if self.max_seq_len is not None and self.max_seq_len > context_len:
            raise ValueError(f"EngineConfig.max_seq_len={self.max_seq_len} exceeds the model's context length "
                             f"(max_position_embeddings={context_len})")
        graph_bs = self.cuda_graph_max_bs
        if graph_bs is None:
            graph_bs = 256 if device.startswith("cuda") and not self.speculative else 0
        return dataclasses.replace(self, device=device, max_seq_len=self.max_seq_len or context_len,
                                   cuda_graph_max_bs=min(graph_bs, self.max_running),
                                   overlap=self.overlap and not self.speculative)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (the dtype by name), for JSON: what a rank process receives."""
        values = dataclasses.asdict(self)
        values["dtype"] = str(self.dtype).replace("torch.", "") if self.dtype is not None else None
        return values



def config_from(settings: dict[str, Any], owner: str = "LLM") -> EngineConfig:
    """``EngineConfig(**settings)``, with an unknown setting named in a ``TypeError``."""
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"{owner} got unknown setting(s) {unknown}; the settings are {sorted(known)}")
    return EngineConfig(**settings)


def default_device() -> str:
    """Where the engine runs when ``device`` is not given: CUDA if available, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
