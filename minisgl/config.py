"""`ModelConfig`: the few numbers the engine needs, read from a Hugging Face `config.json`.

One config type serves every supported architecture. The differences between Qwen3, Llama and
Qwen2 that matter to the model code are captured by three flags: ``qk_norm`` (Qwen3 normalises
each query/key head), ``attention_bias`` (Qwen2 has biases on q/k/v) and ``rope_scaling``
(Llama 3.1 rescales its RoPE frequencies). Qwen3-MoE and Qwen2-MoE (lesson 11) add the
mixture-of-experts fields (``num_experts`` and the rest); for a dense model they stay at their
defaults.
"""

from __future__ import annotations

__lesson__ = 1

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# HF architecture name -> our short name. Everything else is rejected with a clear error.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3MoeForCausalLM": "qwen3_moe",  # lesson 11: Qwen3 attention, mixture-of-experts MLPs
    "Qwen2MoeForCausalLM": "qwen2_moe",  # lesson 11: Qwen2 attention, experts plus a shared expert
}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture (or one of its options) is not implemented here."""


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a decoder-only transformer.

    Invariants: ``num_heads % num_kv_heads == 0`` (grouped-query attention maps query head
    ``h`` to KV head ``h // (num_heads // num_kv_heads)``); ``head_dim`` is even (RoPE rotates
    pairs). A mixture-of-experts model (``num_experts > 0``, lesson 11) routes each token to
    ``1 <= num_experts_per_tok <= num_experts`` experts in the layers :meth:`is_moe_layer` names;
    its other layers keep a dense MLP of ``intermediate_size``.
    """

    architecture: str  # "qwen3" | "llama" | "qwen2" | "qwen3_moe" | "qwen2_moe"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    rope_scaling: dict[str, Any] | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    dtype: torch.dtype = torch.float32
    tp_size: int = 1  # lesson 9: >1 means this config is one rank's slice (see ``shard``)
    # Lesson 11, mixture of experts (0 experts: a dense model). Names as in HF's config.json.
    num_experts: int = 0  # experts per MoE layer
    num_experts_per_tok: int = 0  # top-k: experts each token is routed to
    moe_intermediate_size: int = 0  # each expert's SwiGLU width (one rank's slice under TP, whole under EP)
    norm_topk_prob: bool = False  # rescale the top-k router probabilities to sum to 1
    decoder_sparse_step: int = 1  # layer i is MoE when (i + 1) % decoder_sparse_step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an expert every token uses (0: none)
    ep_size: int = 1  # lesson 11: >1 means the experts are split across ranks whole (see ``shard``)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise UnsupportedModelError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2 != 0:
            raise UnsupportedModelError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.num_experts < 0:
            raise UnsupportedModelError(f"num_experts={self.num_experts} must be >= 0")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise UnsupportedModelError(f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                                            f"1..num_experts={self.num_experts}")
            if self.moe_intermediate_size < 1:
                raise UnsupportedModelError(f"moe_intermediate_size={self.moe_intermediate_size} must be >= 1")
            if self.decoder_sparse_step < 1:
                raise UnsupportedModelError(f"decoder_sparse_step={self.decoder_sparse_step} must be >= 1")
            bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
            if bad:
                raise UnsupportedModelError(f"mlp_only_layers {bad} are not layers of a {self.num_layers}-layer model")

    def is_moe_layer(self, layer_id: int) -> bool:
        """Lesson 11: whether layer ``layer_id``'s MLP is a mixture of experts (HF's rule: every
        ``decoder_sparse_step``-th layer, counting from 1, except ``mlp_only_layers``)."""
        return (self.num_experts > 0 and layer_id not in self.mlp_only_layers
                and (layer_id + 1) % self.decoder_sparse_step == 0)

    def shard(self, tp_size: int, ep_size: int = 1) -> ModelConfig:
        """Lesson 9: the shapes one of ``tp_size`` tensor-parallel ranks holds: its query heads,
        its KV heads and its slice of the MLP's intermediate features (and of every expert's,
        lesson 11: each rank holds a slice of all the experts). This is the one place the
        per-rank head counts come from: the model, the KV pool and the attention backends are
        all built from the sharded config. The vocabulary stays whole here (the embedding and
        LM head cut it themselves, padding the last slice).

        Lesson 11, ``ep_size == tp_size`` (expert parallelism): the experts are not cut;
        ``moe_intermediate_size`` stays whole and each rank holds ``num_experts / ep_size`` of
        them (``num_experts`` stays the router's count). Attention, dense MLPs and a shared
        expert are cut as under TP."""
        if ep_size != 1:
            if ep_size != tp_size:
                raise UnsupportedModelError(f"ep_size={ep_size} must be 1 or tp_size={tp_size} (the experts are split "
                                            "over the tensor-parallel ranks)")
            if not self.num_experts:
                raise UnsupportedModelError(f"ep_size={ep_size}: expert parallelism needs a mixture-of-experts model; "
                                            f"this {self.architecture} model has no experts")
            if self.num_experts % ep_size:
                raise UnsupportedModelError(f"ep_size={ep_size} does not divide the model's num_experts={self.num_experts}")
        if tp_size == 1:
            return self
        whole_experts = ep_size > 1
        cut = ["num_heads", "num_kv_heads", "intermediate_size", "shared_expert_intermediate_size"]
        cut += [] if whole_experts else ["moe_intermediate_size"]
        for name in cut:
            if getattr(self, name) % tp_size:
                raise UnsupportedModelError(
                    f"tp_size={tp_size} does not divide the model's {name}={getattr(self, name)}")
        moe_intermediate = self.moe_intermediate_size if whole_experts else self.moe_intermediate_size // tp_size
        return dataclasses.replace(self, num_heads=self.num_heads // tp_size, num_kv_heads=self.num_kv_heads // tp_size,
                                   intermediate_size=self.intermediate_size // tp_size,
                                   moe_intermediate_size=moe_intermediate,
                                   shared_expert_intermediate_size=self.shared_expert_intermediate_size // tp_size,
                                   tp_size=tp_size, ep_size=ep_size)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of KV cache one token occupies across all layers: 2 (K and V) x H_kv x D x L x size."""
        itemsize = torch.empty((), dtype=dtype or self.dtype).element_size()
        return 2 * self.num_kv_heads * self.head_dim * self.num_layers * itemsize

    @classmethod
    def from_dict(cls, raw: dict[str, Any], generation_config: dict[str, Any] | None = None) -> ModelConfig:
        """Build from the parsed ``config.json`` (and optionally ``generation_config.json``)."""
        archs = raw.get("architectures") or []
        known = [SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES]
        if not known:
            raise UnsupportedModelError(
                f"unsupported architecture {archs or raw.get('model_type')!r}; "
                f"minisgl implements {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        arch = known[0]
        if raw.get("mlp_bias"):
            raise UnsupportedModelError("mlp_bias=True is not supported")
        num_heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads

        # transformers >= 5 writes RoPE settings into "rope_parameters"; older checkpoints (and
        # every released Qwen/Llama checkpoint) use top-level "rope_theta" + "rope_scaling".
        rope_params = dict(raw.get("rope_parameters") or {})
        rope_theta = raw.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = raw.get("rope_scaling") or rope_params or None
        if scaling is not None:
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type == "default":
                scaling = None
            elif rope_type != "llama3":
                raise UnsupportedModelError(f"rope scaling type {rope_type!r} is not supported")
            else:
                scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}

        eos: list[int] = []
        for source in (raw, generation_config or {}):
            ids = source.get("eos_token_id")
            for i in ids if isinstance(ids, list) else [ids]:
                if i is not None and i not in eos:
                    eos.append(int(i))

        dtype_name = raw.get("torch_dtype") or raw.get("dtype") or "float32"
        return cls(
            **_moe_fields(arch, raw),
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(raw.get("qkv_bias", True) if arch == "qwen2_moe"
                                                   else raw.get("attention_bias", False)),
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            rope_scaling=scaling,
            eos_token_ids=tuple(eos),
            bos_token_id=raw.get("bos_token_id"),
            dtype=_DTYPES.get(str(dtype_name).replace("torch.", ""), torch.float32),
            extra=raw,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and ``generation_config.json`` if present) from a checkpoint dir."""
        path = Path(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else None
        return cls.from_dict(json.loads(config_file.read_text()), gen)


def _moe_fields(arch: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Lesson 11: the mixture-of-experts fields of a ``config.json`` (none for a dense model).
    Hub checkpoints write ``num_experts``; ``transformers`` 5 writes ``num_local_experts`` for
    Qwen3-MoE."""
    if arch not in ("qwen3_moe", "qwen2_moe"):
        return {}
    if raw.get("use_sliding_window"):
        raise UnsupportedModelError("sliding-window attention (use_sliding_window=true) is not supported")
    num_experts = raw.get("num_experts", raw.get("num_local_experts"))
    if num_experts is None:
        raise UnsupportedModelError(f"{arch} config.json has no num_experts")
    return dict(
        num_experts=int(num_experts),
        num_experts_per_tok=int(raw["num_experts_per_tok"]),
        moe_intermediate_size=int(raw["moe_intermediate_size"]),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        decoder_sparse_step=int(raw.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(int(i) for i in raw.get("mlp_only_layers") or ()),
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
    )
