"""Lesson 1 exercise: the decode loop over a contiguous KV cache.

Write the three functions below, then run ``pytest lessons/l01 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

* :func:`store` and :func:`forward` are :class:`minisgl.attention.contiguous.ContiguousBackend`'s
  methods: write this forward's new K/V into the request's slab, then attend over it.
* :func:`step` is :class:`minisgl.generate.SequenceGenerator`'s method: one forward pass
  (the prefill on the first call, a decode step after) and one greedy token.

Each function takes ``self``: it becomes a method of the package's class, so it reads and writes
that class's attributes (listed in each docstring).
"""

from __future__ import annotations

import torch

from minisgl.attention.base import AttentionBackend  # noqa: F401  (the type the model calls)
from minisgl.attention.contiguous import ContiguousBackend
from minisgl.attention.dense import dense_causal_attention  # noqa: F401  (for your forward)
from minisgl.generate import SequenceGenerator


def store(self: ContiguousBackend, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write this forward's new keys and values into layer ``layer_id``'s slab.

    Shapes: ``k, v [T, Hkv, D]`` (``T`` new tokens). The slab is ``self.cache.k[layer_id]`` and
    ``self.cache.v[layer_id]``, each ``[max_seq_len, Hkv, D]``; position ``p`` lives in row ``p``.

    Invariant: ``self.num_cached`` tokens are already in the cache (set by ``prepare`` before
    the forward), so the new tokens sit at positions ``num_cached .. num_cached + T - 1``.

    Hint: two slice assignments. The classic bug of this lesson is writing one row too far.
    """
    raise NotImplementedError("exercise l01 store(): write ContiguousBackend.store in lessons/l01/exercise.py")


def forward(self: ContiguousBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    """Attention of this forward's new queries over the request's whole history, layer ``layer_id``.

    Shapes: ``q [T, Hq, D]``, ``k, v [T, Hkv, D]`` -> ``[T, Hq, D]``.

    Steps: store the new K/V with ``self.store`` (call it: a test injects a buggy ``store``
    through a subclass and expects your ``forward`` to use it); then run
    ``dense_causal_attention(q, keys, values, num_cached)`` over rows ``0 .. num_cached + T - 1``
    of the slab (cached + new keys, in position order), with ``num_cached = self.num_cached``
    (``store`` does not change it: ``prepare`` of the next forward does).
    """
    raise NotImplementedError("exercise l01 forward(): write ContiguousBackend.forward in lessons/l01/exercise.py")


def step(self: SequenceGenerator) -> int:
    """One forward pass of the model; returns the new (greedy) token.

    Attributes you use: ``self.model`` (call it as ``model(input_ids [T] int64, positions [T]
    int64, backend, logits_indices=...)``; it returns ``[len(logits_indices), vocab]`` logits),
    ``self.kv`` (a ``SequenceKV``: ``prepare(num_cached, num_new)`` returns the backend to run
    with, ``release()`` gives the KV back), ``self.prompt_ids``, ``self.output_ids`` (append the
    token), ``self.max_new_tokens``, ``self.stop_token_ids``, ``self.device``, and set
    ``self.last_logits`` (``[vocab]``, the logits that chose the token) and
    ``self.finish_reason`` (``None`` while running; the property ``self.finished`` is
    ``finish_reason is not None``).

    ``self.prompt_ids`` is any ``Sequence[int]`` (a list, a tuple...): build the input tensor with
    ``torch.tensor(list(ids), dtype=torch.int64, device=self.device)``; ``positions`` likewise
    (``torch.arange(start, start + T, ...)``).

    * First call (no output yet): feed the whole prompt at positions ``0 .. P-1``
      (``prepare(0, P)``).
      Later calls: feed only the latest output token, at position ``self.num_cached`` (the
      property: prompt + outputs - 1). Its K/V is not in the cache yet: this step writes it.
    * Only the last new token's logits are needed: ``logits_indices = tensor([T - 1])``.
    * Greedy: the token is ``argmax`` of the logits, as a Python ``int``. The model returns
      ``[1, vocab]`` here; ``last_logits`` is its one row.
    * Finish: ``"stop"`` if the token is one of ``stop_token_ids`` (it is kept in the output),
      else ``"length"`` once ``max_new_tokens`` tokens are out. A finished request releases its KV.
    * If ``prepare`` or the model raises (e.g. the cache is full), set ``finish_reason`` to
      ``"abort"``, release the KV and re-raise (wrap both ``prepare`` and the model call in one
      ``try``).
    * Calling ``step`` on a finished generator raises ``RuntimeError``.
    """
    raise NotImplementedError("exercise l01 step(): write SequenceGenerator.step in lessons/l01/exercise.py")
