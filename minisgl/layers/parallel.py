"""Lesson 9: tensor-parallel layers. Each holds this rank's slice of a weight matrix, and
``shard_dim`` says which dimension of the checkpoint tensor was cut (the loader slices by it).

* :class:`ColumnParallelLinear` (QKV, gate/up): output features cut; each rank computes its own
  heads / its own slice of the intermediate activations. No communication.
* :class:`RowParallelLinear` (o_proj, down_proj): input features cut, matching the column
  layer before it; each rank's product is a partial sum of the full output, and an all-reduce
  adds them up.
* :class:`VocabParallelEmbedding`: vocabulary rows cut; a rank embeds only the ids it owns
  (zeros for the others) and an all-reduce completes every row (as a row-parallel layer's, it
  may be left to the pre-norm step after it: the first layer's).
* :class:`ParallelLMHead`: vocabulary rows cut; each rank computes the logits of its slice and
  an all-gather puts them side by side, ``[T, vocab]``.

With one rank all of them are plain ``nn.Linear`` / ``nn.Embedding`` (the linear ones are lesson 8's
:class:`~minisgl.layers.decode_kernels.DecodeLinear`, whose one-row products run its GEMV). :class:`ParallelLayers`
hands them to the model (lesson 1's :class:`~minisgl.models.model.Layers` seam).
"""

from __future__ import annotations

__lesson__ = 9

import torch
from torch import nn

from minisgl.distributed.tp import PendingSum, TPGroup, get_tp
from minisgl.layers.decode_kernels import DecodeLayers, DecodeLinear, decode_linear
from minisgl.utils import cdiv


class ColumnParallelLinear(DecodeLinear):
    """``[T, in] -> [T, out / tp]``: this rank's output features (e.g. its heads)."""

    shard_dim = 0


class RowParallelLinear(DecodeLinear):
    """``[T, in / tp] -> [T, out]``, summed over the ranks. Bias, if any, is added once, after
    the sum."""

    shard_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp or get_tp()

    def forward(self, x: torch.Tensor, silu_and_mul: bool = False) -> torch.Tensor | PendingSum:
        """``x [T, in / tp]`` -> ``[T, out]``: this rank's partial product, summed over the ranks,
        then the bias. Without a bias, where the group fuses the all-reduce into the pre-norm step
        that follows (GPUs, small batches), the sum is left to that step: a :class:`PendingSum`.
        With ``silu_and_mul``, ``x`` is this rank's ``[gate | up]``, ``[T, 2 in / tp]``, and the
        product is of ``silu(gate) * up``: the activation is elementwise, so each rank
        applies it to its own slice of the intermediate features (inside lesson 8's GEMV at bs=1)."""
        partial = decode_linear(x, self.weight, silu_and_mul=silu_and_mul)
        if self.bias is None:  # the sum may wait for the pre-norm step after this layer (TPGroup.reduce_later)
            return self.tp.reduce_later(partial)
        return self.tp.all_reduce(partial) + self.bias

    def forward_silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The MLP's down projection with its activation: :meth:`forward` with ``silu_and_mul``."""
        return self(gate_up, silu_and_mul=True)


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``rank * shard .. (rank + 1) * shard`` of the embedding (``shard = ceil(vocab / tp)``;
    the last rank's rows beyond the vocabulary stay zero)."""

    shard_dim = 0

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup | None = None) -> None:
        self.tp = tp or get_tp()
        self.shard = cdiv(vocab_size, self.tp.size)
        super().__init__(self.shard, hidden_size)
        self.vocab_start = self.tp.rank * self.shard

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(input_ids)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.shard)
        out = super().forward(local.clamp(0, self.shard - 1)) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.reduce_later(out)  # the first layer's pre-norm step may do the sum


class ParallelLMHead(DecodeLinear):
    """``[T, hidden] -> [T, vocab]``: this rank's ``ceil(vocab / tp)`` rows, then an all-gather
    (columns beyond the vocabulary, on the last rank, are cut off)."""

    shard_dim = 0

    def __init__(self, hidden_size: int, vocab_size: int, tp: TPGroup | None = None) -> None:
        self.tp = tp or get_tp()
        self.vocab_size = vocab_size
        super().__init__(hidden_size, cdiv(vocab_size, self.tp.size), bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)  # [T, vocab / tp]
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather_last_dim(logits)[..., : self.vocab_size]


class ParallelLayers(DecodeLayers):
    """The model's layers cut across the ranks of ``tp`` (default: this process's group), with
    lesson 8's decode kernels (one-row products, Qwen3's fused norms + RoPE) inside each slice."""

    def __init__(self, tp: TPGroup | None = None) -> None:
        self.tp = tp

    def column(self, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
        return ColumnParallelLinear(in_features, out_features, bias=bias)

    def row(self, in_features: int, out_features: int) -> nn.Module:
        return RowParallelLinear(in_features, out_features, tp=self.tp)  # partial sums, all-reduced

    def embedding(self, vocab_size: int, hidden_size: int) -> nn.Module:
        return VocabParallelEmbedding(vocab_size, hidden_size, tp=self.tp)

    def lm_head(self, hidden_size: int, vocab_size: int) -> nn.Module:
        return ParallelLMHead(hidden_size, vocab_size, tp=self.tp)  # gathers [T, vocab]
