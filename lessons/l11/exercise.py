"""Lesson 11 exercise: the router, and the token grouping by expert.

Write the two functions below, then run ``pytest lessons/l11 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these, including every
module that imported ``group_by_expert`` by name; see ``tests/tools/exercises.py``). Without
``--mine`` the tests run the package as usual. The TP/EP tests run the model in rank processes
and the server test in a server process; ``--mine`` makes the same swap there.

* :func:`router_forward` is :class:`minisgl.layers.moe.Router`'s ``forward``: which ``k`` of the
  ``E`` experts each token goes to, and with what weight. Every MoE layer of the model calls it
  on the CPU, so a wrong router changes the tokens (the parity tests against Hugging Face).
* :func:`group_by_expert` is the module-level function of ``minisgl/layers/fused_moe.py`` (read
  its module docstring): the token slots sorted by expert and padded into blocks that each
  belong to one expert, the layout the fused GPU kernels read. On the CPU the lesson's tests
  check its invariants directly (``test_l11_fused_moe.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: F401  (F.linear(x, weight) == x @ weight.T)

from minisgl.layers.fused_moe import BLOCK_M, max_blocks  # noqa: F401  (max_blocks: how many blocks at most)
from minisgl.layers.moe import Router


def router_forward(self: Router, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, hidden]`` -> ``(weights [T, k], ids [T, k])``: each token's ``k = self.top_k``
    experts and their weights, largest weight first.

    ``self.weight`` is ``[E, hidden]`` (Hugging Face's ``mlp.gate.weight``): the router logits
    are ``x @ self.weight.T``, ``[T, E]``. Take the softmax over all ``E`` experts **in float32**
    (``dtype=torch.float32``: in bf16 near-ties between experts flip), then the ``k`` largest
    probabilities and their expert ids (``Tensor.topk``; ids are int64). With
    ``self.renormalize`` (``norm_topk_prob`` in the checkpoint) rescale each token's ``k``
    weights to sum to 1; without it keep them as they are (they sum to less than 1). Return the
    weights in ``x``'s dtype.

    Mind the order: a softmax over the ``k`` chosen logits only also sums to 1, and equals the
    renormalised answer, but not the answer without renormalisation.
    """
    raise NotImplementedError("exercise l11 router_forward(): write Router.forward in lessons/l11/exercise.py")


def group_by_expert(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``T * k`` token slots grouped by expert, each expert's run padded to whole blocks of
    ``block_m``: ``(slots, block_expert)``.

    ``ids [T, k]`` (int64) are each token's experts; slot ``t * k + j`` is token ``t``'s
    ``j``-th choice. With ``B = max_blocks(T * k, num_experts, block_m)`` blocks:

    * ``slots [B * block_m]`` (int32): expert 0's slots first, in increasing slot order, then
      expert 1's, ...; each expert's run starts at a multiple of ``block_m`` (so every block
      holds one expert's slots); the gaps after a run and the unused tail hold ``T * k`` (an
      invalid slot the kernels skip). Experts no token chose take no block.
    * ``block_expert [B]`` (int32): the expert of each block; ``num_experts`` for the blocks
      after the last run.

    Example: ``ids = [[2, 0], [2, 1], [0, 2]]`` (slots 0..5 choose experts 2, 0, 2, 1, 0, 2),
    ``num_experts = 4``, ``block_m = 2``: ``B = 3 + 4 = 7``; expert 0 has slots [1, 4], expert
    1 has [3], expert 2 has [0, 2, 5]: ``slots = [1, 4, 3, 6, 0, 2, 5, 6, 6, 6, 6, 6, 6, 6]``,
    ``block_expert = [0, 1, 2, 2, 4, 4, 4]``.

    Hints: ``torch.argsort(flat, stable=True)`` sorts the slots by expert; the count per expert
    (``torch.bincount(flat, minlength=num_experts)``), rounded up to a multiple of ``block_m``,
    and its running sum (``torch.cumsum``) say where each run starts. For the GPU, the package
    avoids anything that asks the host for a size (a CUDA graph could not capture it); on the
    CPU any correct answer passes.
    """
    raise NotImplementedError("exercise l11 group_by_expert(): write group_by_expert in lessons/l11/exercise.py")
