"""One decoder-only transformer for Qwen3, Llama (3.x) and Qwen2 (and Qwen3-MoE, lesson 11).

The model works on a *flattened token stream*: ``input_ids [T]`` and ``positions [T]`` may hold
tokens of one request (lessons 1-3) or of many requests back to back (lesson 4 on). The model
itself never needs to know which token belongs to which request: only attention does, and the
attention backend is told before the forward pass.

Parameter names mirror Hugging Face's, except that q/k/v are fused into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (one matmul instead of three or two); the loader fuses them.
"""

from __future__ import annotations

__lesson__ = 1

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.attention.base import AttentionBackend
from minisgl.config import ModelConfig, UnsupportedModelError
from minisgl.layers import RMSNorm, RotaryEmbedding, fused


class Layers:
    """How the model builds its weight matrices: plain ``nn.Linear`` / ``nn.Embedding``.

    The seam two later lessons fill: lesson 8's
    :class:`~minisgl.layers.decode_kernels.DecodeLayers` returns layers whose one-row products
    and Qwen3 norms + RoPE run fused kernels, and lesson 9's
    :class:`~minisgl.layers.parallel.ParallelLayers` returns layers that hold one rank's slice
    and communicate; the model code is the same either way. Lesson 11's
    :class:`~minisgl.layers.moe.MoELayers` fills :meth:`mlp` with mixture-of-experts blocks."""

    def column(self, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
        """A projection whose output features may be split (QKV, gate/up)."""
        return nn.Linear(in_features, out_features, bias=bias)

    def row(self, in_features: int, out_features: int) -> nn.Module:
        """A projection whose input features may be split (o_proj, down_proj), no bias."""
        return nn.Linear(in_features, out_features, bias=False)

    def embedding(self, vocab_size: int, hidden_size: int) -> nn.Module:
        return nn.Embedding(vocab_size, hidden_size)

    def lm_head(self, hidden_size: int, vocab_size: int) -> nn.Module:
        """``[T, hidden] -> [T, vocab]`` logits, whole."""
        return nn.Linear(hidden_size, vocab_size, bias=False)

    def rotary(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int) -> RotaryEmbedding:
        """The rotary embedding (with Qwen3's q/k norms applied inside it); lesson 8 fuses it."""
        return RotaryEmbedding(head_dim, theta, scaling, max_positions)

    def mlp(self, config: ModelConfig, layer_id: int) -> nn.Module:
        """Layer ``layer_id``'s feed-forward block, ``[T, hidden] -> [T, hidden]``: the dense
        :class:`MLP`. A mixture-of-experts layer is lesson 11's to build; here it is refused."""
        if config.is_moe_layer(layer_id):
            raise UnsupportedModelError(
                f"layer {layer_id} of this {config.architecture} model is a mixture of experts: build the "
                "model with lesson 11's MoELayers (minisgl.layers.moe), as the engine's builder does")
        return MLP(config, self)


def normed_projection(proj: nn.Module, norm: RMSNorm, h: torch.Tensor,
                      residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm step and what follows it: ``residual <- h + residual`` (``residual`` None, the
    first layer: the stream starts at ``h``), then ``proj(norm(residual))`` for any module
    ``proj`` of ``[T, hidden]`` (a projection, a whole MLP). Returns ``(proj's output [T, out],
    residual [T, hidden])``. A module that does better with the un-normed input has a
    ``forward_normed`` method: :class:`MLP` (its gate/up projection takes the norm along) and
    lesson 8's one-row GEMV, which does all of it in one kernel inside a graph. An ``h`` that is
    not a tensor (lesson 9's sum still to be all-reduced, :func:`add_and_norm`) takes the plain
    path: its own kernel does the add and the norm with the all-reduce."""
    if isinstance(h, torch.Tensor) and hasattr(proj, "forward_normed"):
        return proj.forward_normed(norm, h, residual)
    x, residual = add_and_norm(norm, h, residual)
    return proj(x), residual


def add_and_norm(norm: RMSNorm, h, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm.add_and_norm(h, residual)``: ``(norm(h + residual), h + residual)``. ``h`` is a
    sub-layer's output: a tensor, or under lesson 9's tensor parallelism on GPUs a row-parallel
    layer's partial sum still to be all-reduced, which brings its own ``add_and_norm`` (the
    all-reduce, the add and the norm in one kernel)."""
    if isinstance(h, torch.Tensor):
        return norm.add_and_norm(h, residual)
    return h.add_and_norm(norm, residual)


class Attention(nn.Module):
    """Self-attention: fused QKV projection, optional q/k RMSNorm (Qwen3), RoPE, backend, output proj."""

    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, layers: Layers) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        # Under tensor parallelism (lesson 9) ``config`` is this rank's slice: its heads only.
        self.qkv_proj = layers.column(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = layers.row(self.q_size, config.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.rotary = rotary

    def forward(self, norm: RMSNorm, h: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole pre-norm sub-layer: attention of ``norm(h + residual)`` (``h``, ``residual``
        ``[T, hidden]``) -> ``([T, hidden], the new residual)``."""
        qkv, residual = normed_projection(self.qkv_proj, norm, h, residual)
        return self.attend(qkv, positions, backend), residual

    def attend(self, qkv: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """From the QKV projection's output ``[T, q + 2 kv]`` on: norms and RoPE, attention, o_proj."""
        T = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(T, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.reshape(T, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        if backend.rotates_qk:  # lesson 8: a fused decode kernel applies the norms and RoPE as it loads q/k
            out = backend.forward_rotating(q, k, v, self.layer_id, positions, self.rotary, self.q_norm, self.k_norm)
        else:
            q, k = self.rotary(positions, q, k, self.q_norm, self.k_norm)  # Qwen3: per-head norms, then RoPE
            out = backend.forward(q, k, v, self.layer_id)  # [T, Hq, D]
        return self.o_proj(out.reshape(T, self.q_size))


class MLP(nn.Module):
    """SwiGLU MLP: ``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig, layers: Layers) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = layers.column(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = layers.row(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` (already normed) -> ``[T, hidden]``."""
        return self.activate_and_down(self.gate_up_proj(x))

    def forward_normed(self, norm: RMSNorm, h: torch.Tensor,
                       residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole pre-norm sub-layer: ``self(norm(h + residual))`` and the new residual."""
        gate_up, residual = normed_projection(self.gate_up_proj, norm, h, residual)
        return self.activate_and_down(gate_up), residual

    def activate_and_down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``down(silu(gate) * up)`` of ``gate_up [T, 2 * intermediate]``."""
        if fused.use_flashinfer(gate_up):  # one kernel instead of two (lesson 8)
            return self.down_proj(fused.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, layers: Layers) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_id, rotary, layers)
        self.mlp = layers.mlp(config, layer_id)  # dense SwiGLU, or (lesson 11) a mixture of experts
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, backend: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm block. ``h`` is the previous sub-layer's output, not yet added to ``residual``
        (the add is fused into the next norm, and at bs=1 in lesson 8's graphs the norm into the
        projection after it: :func:`normed_projection`); returns the new ``(h, residual)`` pair."""
        h, residual = self.self_attn(self.input_layernorm, h, residual, positions, backend)
        return normed_projection(self.mlp, self.post_attention_layernorm, h, residual)


class DecoderModel(nn.Module):
    """Embedding, decoder layers, final norm (HF's ``model.*`` prefix)."""

    def __init__(self, config: ModelConfig, layers: Layers) -> None:
        super().__init__()
        # One rotary module shared by every layer (it holds no weights, only inv_freq).
        rotary = layers.rotary(config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings)
        self.embed_tokens = layers.embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, rotary, layers) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        h, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            h, residual = layer(h, residual, positions, backend)
        return add_and_norm(self.norm, h, residual)[0]


class CausalLM(nn.Module):
    """The full model: ``forward(input_ids [T], positions [T], backend) -> logits``.

    ``logits_indices`` picks which of the ``T`` positions get logits (e.g. only the last token
    of each request in a prefill); by default every position does. Logits come in the model's
    dtype (float32 for the CPU tests, bf16 on a GPU): their argmax is the argmax of their exact
    float32 values, and the sampler converts to float32 only the rows it computes
    probabilities for. With ``out`` (a ``[rows, vocab]`` tensor of the model's dtype) they are
    written there and ``out`` is returned (lesson 8's graphs keep their output at a fixed address).
    ``layers`` builds the weight matrices (default: plain :class:`Layers`).
    """

    def __init__(self, config: ModelConfig, layers: Layers | None = None) -> None:
        super().__init__()
        layers = layers or Layers()
        self.config = config
        self.model = DecoderModel(config, layers)
        self.lm_head = layers.lm_head(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        logits_indices: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if input_ids.dim() != 1 or input_ids.shape != positions.shape:
            raise ValueError(f"expected flat input_ids/positions of equal length, got {input_ids.shape}, {positions.shape}")
        hidden = self.model(input_ids, positions, backend)  # [T, hidden]
        if logits_indices is not None:
            hidden = hidden[logits_indices]
        logits = self.lm_head(hidden)  # [T or len(logits_indices), vocab] in the model's dtype
        return logits if out is None else out.copy_(logits)
