"""Lesson 9 exercise: the forward passes of the tensor-parallel layers.

Write the three functions below, then run ``pytest lessons/l09 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

The TP tests run the model in two *rank processes* (``LLM(tp_size=2)``), fresh interpreters.
``--mine`` makes the same swap there: every child Python of the test run reads the
``MINISGL_EXERCISES`` environment variable at start-up (a ``sitecustomize`` on its path) and
installs your functions before the rank builds its model. So a rank's traceback (reported by
the test as ``TPRankError``) points into this file too.

All three are methods of classes in ``minisgl/layers/parallel.py`` (read its docstring). Each
layer holds this rank's slice of the weight; ``self.tp`` is the rank's
:class:`minisgl.distributed.tp.TPGroup`: ``rank``, ``size``, ``all_reduce(x)`` (sums ``x`` over
the ranks in place and returns it; every rank gets the same sum) and ``all_gather_last_dim(x)``
(``[..., n]`` on every rank -> ``[..., size * n]``, rank 0's columns first). With one rank both
return their input.

How an MLP is split (the loader slices the checkpoint by each layer's ``shard_dim``):
``gate_up`` is column-parallel (each rank computes its slice of the intermediate features, no
communication), ``down`` is row-parallel (each rank multiplies its slice of the intermediate
features by its slice of the weight's *input* columns: a partial sum of the full output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: F401  (F.linear(x, weight) == x @ weight.T; F.embedding(ids, weight))
from torch import nn  # noqa: F401  (nn.Embedding.forward, nn.Linear.forward: the plain layers)

from minisgl.layers.decode_kernels import decode_linear  # noqa: F401  (F.linear, with lesson 8's GEMV in graphs)
from minisgl.layers.parallel import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding


def row_parallel_forward(self: RowParallelLinear, x: torch.Tensor, silu_and_mul: bool = False):
    """``x [T, in / tp]`` (this rank's slice of the input features) -> ``[T, out]``, the full
    output, identical on every rank.

    ``self.weight`` is ``[out, in / tp]``; ``self.bias`` is ``None`` or ``[out]`` (whole on every
    rank). Sum the ranks' partial products; add the bias once, *after* the sum (added before,
    it would be counted ``tp`` times). No special case for one rank is needed: there
    ``all_reduce`` returns its input. (``all_reduce`` works in place: give it a tensor you own,
    such as the fresh product, never ``x`` or a weight.)

    Without a bias, let the group choose when to sum: ``self.tp.reduce_later(product)``
    all-reduces it, or (on GPUs, where the sum's next stop is a pre-norm step that one kernel can
    do together with the all-reduce) returns it as a ``PendingSum`` for that step. With a bias,
    ``all_reduce`` and then the bias.

    ``silu_and_mul`` (the MLP's down projection calls it so): ``x`` is this rank's
    ``[gate | up]``, ``[T, 2 in / tp]``, and the product is of ``silu(gate) * up``; hand the flag
    to ``decode_linear(x, self.weight, silu_and_mul=...)``, which applies it (lesson 8). The sum
    and the bias are the same either way.
    """
    raise NotImplementedError("exercise l09 row_parallel_forward(): write RowParallelLinear.forward "
                              "in lessons/l09/exercise.py")


def vocab_parallel_embedding_forward(self: VocabParallelEmbedding, input_ids: torch.Tensor) -> torch.Tensor:
    """``input_ids [T]`` (any ids of the whole vocabulary) -> ``[T, hidden]`` embeddings, identical
    on every rank.

    This rank holds rows ``self.vocab_start .. self.vocab_start + self.shard - 1`` of the
    embedding table as ``self.weight [shard, hidden]``. With one rank (``self.tp.size == 1``) it
    is a plain lookup (``nn.Embedding.forward(self, input_ids)``). Otherwise: look up the ids this
    rank owns (shifted into ``0 .. shard - 1``; ``F.embedding(local_ids, self.weight)`` is the
    plain lookup), give every other id a row of zeros (mind that a lookup of an id outside the
    table raises: replace those ids by a valid one, e.g. 0, look up, then zero their rows with a
    mask), and sum over the ranks: exactly one rank contributes each row. As the row-parallel
    layer does, let the group choose when: ``self.tp.reduce_later(rows)`` all-reduces them, or
    (on GPUs) leaves them to the first layer's pre-norm step, which sums them in its own kernel.
    """
    raise NotImplementedError("exercise l09 vocab_parallel_embedding_forward(): write "
                              "VocabParallelEmbedding.forward in lessons/l09/exercise.py")


def parallel_lm_head_forward(self: ParallelLMHead, x: torch.Tensor) -> torch.Tensor:
    """``x [T, hidden]`` -> ``[T, vocab]`` logits, identical on every rank.

    This rank holds ``ceil(vocab / tp)`` rows of the LM head, ``self.weight [vocab / tp,
    hidden]``, so its product is its slice of the logits. Put the slices side by side along the
    last dimension, rank 0's first; the last rank's slice may run past the vocabulary
    (``self.vocab_size``): cut those columns off. With one rank the product is the answer.
    """
    raise NotImplementedError("exercise l09 parallel_lm_head_forward(): write ParallelLMHead.forward "
                              "in lessons/l09/exercise.py")
