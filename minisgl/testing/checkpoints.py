"""Tiny Hugging Face-format checkpoints, built offline, that `transformers` and `minisgl` both load.

A checkpoint directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json`` (a byte-level BPE trained here with `tokenizers` on a small built-in corpus)
and ``tokenizer_config.json`` with a chat template. Everything is deterministic from a seed.

Why not the default HF init? A tiny model initialised with std 0.02 is nearly a constant
function: greedy decoding repeats one token forever, and then a parity test compares two
identical boring sequences and proves nothing. We draw weights with a large std, random norm
gains and non-zero biases, so that wrong positions, wrong layers or a forgotten bias change the
output. :func:`distinct_fraction` lets tests assert that diversity.

Lesson 11 adds tiny mixture-of-experts checkpoints: ``tiny_checkpoint("qwen3_moe")`` (8 experts,
top-2, every layer sparse; :data:`SPARSE_MOE_KWARGS` for dense layers in between and no top-k
renormalisation) and ``"qwen2_moe"`` (a shared expert beside the routed ones), in the hub's
one-matrix-per-expert layout or, with ``expert_layout="stacked"``, the stacked layout
``transformers`` keeps in memory. :func:`expert_usage` counts the experts a workload routes to.
"""

from __future__ import annotations

__lesson__ = 'tooling'

import atexit
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minisgl.tokenizer import CHATML_TEMPLATE, save_hf_tokenizer, train_byte_level_bpe

ARCHITECTURES = ("qwen3", "llama", "qwen2")
MOE_ARCHITECTURES = ("qwen3_moe", "qwen2_moe")  # lesson 11: built by tiny_checkpoint too, loaded with MoELayers

# Special tokens per family, mirroring the real models' conventions.
_SPECIALS = {
    "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "qwen3_moe": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "qwen2_moe": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
}

_LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# A small corpus, written for this project, to train the BPE tokenizer on.
CORPUS = """\
A serving engine turns prompts into tokens as fast as the hardware allows.
The key and value vectors of every past token are kept in a cache, so each new token costs one
small step instead of a full pass over the whole sequence. Prefill reads the prompt at once;
decode adds one token at a time. Paged memory splits the cache into blocks, and a block table
maps each request to its blocks, like virtual memory in an operating system.
Continuous batching lets requests join and leave the running batch at every step. A radix tree
remembers shared prefixes so a second request with the same system prompt skips work.
Chunked prefill cuts a long prompt into pieces that fit a token budget. Overlap scheduling
prepares the next step on the CPU while the GPU computes the current one. CUDA graphs replay a
captured decode step without launch overhead. Tensor parallelism splits every layer across
devices and sums partial results with an all-reduce. The HTTP server speaks the OpenAI protocol.
The quick brown fox jumps over the lazy dog. Once upon a time there was a tiny model that
learned to count: one, two, three, four, five, six, seven, eight, nine, ten.
def attention(q, k, v): return softmax(q @ k.T / sqrt(d)) @ v
Numbers 0 1 2 3 4 5 6 7 8 9 and symbols + - * / = < > ( ) [ ] { } , . ; : ! ? ' " # @ % &
"""

# Prompts of different lengths used across the lesson tests.
TEST_PROMPTS = (
    "Hello",
    "The key and value vectors",
    "Continuous batching lets requests join and leave the running batch at every step.",
    "Paged memory splits the cache into blocks, and a block table maps each request to its "
    "blocks, like virtual memory in an operating system. A radix tree remembers shared prefixes",
    "def attention(q, k, v):",
)


def _base_config(arch: str, vocab_size: int, special_ids: dict[str, int], head_dim: int, dtype: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 4 * head_dim,  # = num_attention_heads * head_dim
        "intermediate_size": 8 * head_dim,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "initializer_range": 0.02,
        "torch_dtype": dtype,
    }
    if arch == "qwen3":
        cfg.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True,
            bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], attention_bias=False,
        )
    elif arch == "qwen2":
        cfg.update(
            architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=special_ids["<|im_end|>"],
        )
    elif arch == "qwen3_moe":
        # Qwen3 attention; every layer's MLP a mixture of 8 experts, top-2, renormalised (as
        # Qwen3-30B-A3B). The dense intermediate_size only serves layers made dense by overrides.
        cfg.update(
            architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], attention_bias=False,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=2 * head_dim, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[],
        )
    elif arch == "qwen2_moe":
        # Qwen2 attention (q/k/v biases); 8 experts, top-2, not renormalised (as Qwen1.5-MoE), and
        # a shared expert twice as wide as a routed one.
        cfg.update(
            architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], qkv_bias=True,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=2 * head_dim, norm_topk_prob=False,
            shared_expert_intermediate_size=4 * head_dim, decoder_sparse_step=1, mlp_only_layers=[],
        )
    elif arch == "llama":
        cfg.update(
            architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False,
            bos_token_id=special_ids["<|begin_of_text|>"],
            # Llama 3 has several EOS ids: end of text and end of turn.
            eos_token_id=[special_ids["<|end_of_text|>"], special_ids["<|eot_id|>"]],
            attention_bias=False, mlp_bias=False,
            rope_scaling={
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    else:
        raise ValueError(f"unknown architecture {arch!r}; choose from {ARCHITECTURES}")
    return cfg


def _randomize(model: torch.nn.Module, seed: int, std: float) -> None:
    """Large-variance weights, random norm gains and non-zero biases (see module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_((0.5 * std / 0.3) * torch.randn(p.shape, generator=gen))  # 0.5 for the CPU model
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def build_tiny_checkpoint(
    arch: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    head_dim: int = 16,
    dtype: str = "float32",
    vocab_size: int = 512,
    std: float = 0.3,
    expert_layout: str = "per_expert",
    **config_overrides: Any,
) -> Path:
    """Write a tiny HF checkpoint of ``arch`` into ``out_dir`` and return the path.

    ``head_dim=128, dtype="bfloat16"`` gives the GPU test model (FlashInfer's precompiled
    kernels cover head_dim 128). ``config_overrides`` patch ``config.json`` (e.g.
    ``num_hidden_layers=2``). ``expert_layout`` (MoE only): ``"per_expert"``, what
    ``save_pretrained`` writes and the hub holds, or ``"stacked"`` (see :func:`stack_experts`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bars in smoke output

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_byte_level_bpe(CORPUS.splitlines(), vocab_size, _SPECIALS[arch])
    special_ids = {s: tok.token_to_id(s) for s in _SPECIALS[arch]}
    cfg = _base_config(arch, vocab_size, special_ids, head_dim, dtype)
    cfg.update(config_overrides)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed, std)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    if expert_layout == "stacked":
        stack_experts(out)
    elif expert_layout != "per_expert":
        raise ValueError(f"expert_layout must be 'per_expert' or 'stacked', not {expert_layout!r}")

    _save_tokenizer(arch, tok, out)
    return out


def _save_tokenizer(arch: str, tok, out: Path) -> None:
    llama = arch == "llama"
    save_hf_tokenizer(
        tok, out,
        eos="<|eot_id|>" if llama else "<|im_end|>",
        bos="<|begin_of_text|>" if llama else None,
        pad="<|end_of_text|>" if llama else "<|endoftext|>",
        chat_template=_LLAMA3_TEMPLATE if llama else CHATML_TEMPLATE,
    )


def build_tiny_tokenizer(arch: str, out_dir: str | os.PathLike, vocab_size: int = 512) -> Path:
    """Only the tokenizer files of :func:`build_tiny_checkpoint` (the same tokenizer for the same
    ``arch`` and ``vocab_size``), without building and saving a model: for the benchmarks'
    real-shape checkpoints, which load random weights and feed token ids."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _save_tokenizer(arch, train_byte_level_bpe(CORPUS.splitlines(), vocab_size, _SPECIALS[arch]), out)
    return out


# Lesson 11's second tiny MoE checkpoint: six layers, of which only 1 and 5 are sparse (every
# second layer, counting from 1, is a candidate: 1, 3, 5; layer 3 is listed as dense), and each
# token's top-2 weights are used as they come out of the softmax (not rescaled to sum to 1).
SPARSE_MOE_KWARGS: dict[str, Any] = {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                                     "norm_topk_prob": False}


def stack_experts(path: Path) -> None:
    """Rewrite the MoE checkpoint at ``path`` from one matrix per expert
    (``mlp.experts.{e}.{gate,up,down}_proj.weight``, what ``save_pretrained`` writes) into the
    stacked tensors ``transformers`` holds in memory: ``mlp.experts.gate_up_proj [E, 2I, hidden]``
    (each expert's gate rows, then its up rows) and ``mlp.experts.down_proj [E, hidden, I]``."""
    import re

    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    tensors = load_file(file)
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in list(tensors):
        m = re.fullmatch(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", name)
        if m:
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = tensors.pop(name)
    if not experts:
        raise ValueError(f"{path} has no per-expert tensors to stack")
    for prefix, by_id in experts.items():
        ids = sorted(by_id)
        assert ids == list(range(len(ids))), f"{prefix}: experts {ids}"
        tensors[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([by_id[e]["gate"], by_id[e]["up"]]) for e in ids])
        tensors[f"{prefix}.down_proj"] = torch.stack([by_id[e]["down"] for e in ids])
    save_file(tensors, file, metadata={"format": "pt"})


def expert_usage(model, prompts: list[list[int]]) -> dict[int, torch.Tensor]:
    """How often each expert was chosen: ``{layer_id: counts [E]}`` over every token of every
    prompt (one top-k choice counts once), for our ``model`` (a :class:`CausalLM` built with
    lesson 11's ``MoELayers``). Tests use it to check that routing spreads over the experts."""
    from minisgl.attention.base import NoCacheBackend
    from minisgl.layers.moe import Router

    counts: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        router = getattr(layer.mlp, "gate", None)
        if isinstance(router, Router):
            counts[i] = torch.zeros(router.weight.shape[0], dtype=torch.int64)

            def count(module, args, output, i=i):
                counts[i] += torch.bincount(output[1].flatten().cpu(), minlength=len(counts[i]))

            hooks.append(router.register_forward_hook(count))
    try:
        for ids in prompts:
            model(torch.tensor(ids), torch.arange(len(ids)), NoCacheBackend())
    finally:
        for hook in hooks:
            hook.remove()
    return counts


# The GPU test model: head_dim 128 and bf16 (FlashInfer's precompiled kernels), and a smaller
# init std than the CPU model. With std 0.3 a 512-wide random network is so chaotic that HF's
# own bf16 logits differ from its float32 logits by several units; at 0.07 that bf16 noise stays
# below ~0.25 logits while greedy generations stay diverse.
GPU_CHECKPOINT_KWARGS: dict[str, Any] = {"head_dim": 128, "dtype": "bfloat16", "std": 0.07}


# A folder that every process of one test run shares for built checkpoints (the project's
# conftest.py sets it for the run: its worker processes, servers, TP ranks and forked runs build
# each checkpoint once instead of once each). Unset: one temporary folder per process.
SHARED_CACHE_ENV = "MINISGL_TINY_CHECKPOINTS"


@functools.cache
def _cache_root() -> Path:
    """Where built checkpoints go: the shared folder of ``MINISGL_TINY_CHECKPOINTS`` if set (its
    owner removes it), else a temporary folder of this process, removed when it exits."""
    shared = os.environ.get(SHARED_CACHE_ENV)
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    root = Path(tempfile.mkdtemp(prefix="minisgl-tiny-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _built_once(path: Path, build: Callable[[Path], object], marker: str = "config.json") -> Path:
    """``path``, built by ``build(folder)`` unless it is there already. The build goes into a
    folder of its own that is then renamed to ``path`` (one atomic step), so a process sharing
    the cache never reads a half-written checkpoint; when two build at once, the first rename
    wins and the other's copy is dropped (the builds are seeded: the two are the same). ``marker``
    is the file whose presence says the folder is complete."""
    if (path / marker).is_file():
        return path
    scratch = Path(tempfile.mkdtemp(prefix=f"{path.name}.building-", dir=path.parent))
    try:
        build(scratch)
        try:
            os.rename(scratch, path)
        except OSError:
            if not (path / marker).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # (gone already when the rename won)
    return path


def tiny_checkpoint(arch: str, **kwargs: Any) -> Path:
    """Build (once per process, or once per test run: ``MINISGL_TINY_CHECKPOINTS``, then reuse)
    the tiny checkpoint for ``arch`` with ``kwargs``."""
    key = hashlib.sha1(json.dumps([arch, sorted(kwargs.items())], default=str).encode()).hexdigest()[:12]
    return _built_once(_cache_root() / f"{arch}-{key}", lambda out: build_tiny_checkpoint(arch, out, **kwargs))


def tiny_tokenizer(arch: str) -> Path:
    """A folder holding just the tiny checkpoint's tokenizer files for ``arch`` (built once per
    process, or once per run with ``MINISGL_TINY_CHECKPOINTS``)."""
    return _built_once(_cache_root() / f"{arch}-tokenizer", lambda out: build_tiny_tokenizer(arch, out),
                       marker="tokenizer.json")


def draft_checkpoint(target: Path, noise: float = 0.05, seed: int = 0) -> Path:
    """Lesson 12's test draft model: a copy of the checkpoint directory ``target`` (config and
    tokenizer included) with Gaussian noise of ``noise`` x each tensor's own std added to every
    weight (``seed`` draws it). A model that agrees with the target on many tokens but not all:
    at 0.05 on the tiny speculative-test models some steps accept every draft, some a few, some
    none. (Random tiny models are chaotic: at 0.3 almost nothing is accepted.) Built once per
    process and arguments."""
    from safetensors.torch import load_file, save_file

    key = hashlib.sha1(json.dumps([str(target), noise, seed]).encode()).hexdigest()[:12]

    def build(out: Path) -> None:
        shutil.copytree(target, out, dirs_exist_ok=True)
        generator = torch.Generator().manual_seed(seed)
        for file in sorted(out.glob("*.safetensors")):
            weights = load_file(file)
            noisy = {name: (w.float() + noise * w.float().std() * torch.randn(w.shape, generator=generator)).to(w.dtype)
                     for name, w in sorted(weights.items())}
            save_file(noisy, file, metadata={"format": "pt"})

    return _built_once(_cache_root() / f"draft-{key}", build)


def multi_file_checkpoint(arch: str, out: Path) -> Path:
    """The tiny checkpoint of ``arch`` saved again by HF into ``out`` as several safetensors files
    with an index (``model.safetensors.index.json``), as large real checkpoints come."""
    from transformers import AutoModelForCausalLM

    src = tiny_checkpoint(arch)
    AutoModelForCausalLM.from_pretrained(src).save_pretrained(out, max_shard_size="100KB")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("*.safetensors"))) > 1
    return out


def distinct_fraction(token_ids: list[int]) -> float:
    """Fraction of distinct tokens in a generation (1.0 = all different, 1/n = one repeated token)."""
    return len(set(token_ids)) / max(1, len(token_ids))


@functools.cache
def tiny_model(arch: str):
    """Our model on the tiny ``arch`` checkpoint, float32 on the CPU, loaded once per process
    (the model holds no per-request state, so tests may share it)."""
    from minisgl.models import load_model

    layers = None
    if arch in MOE_ARCHITECTURES:
        from minisgl.layers.moe import MoELayers

        layers = MoELayers()
    return load_model(tiny_checkpoint(arch), dtype=torch.float32, layers=layers)
