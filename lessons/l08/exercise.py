"""Lesson 8 exercise: graph buckets, bucket choice, and padding a batch into the scratch page.

Write the three functions below, then run ``pytest lessons/l08 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these, including every
module that imported ``bucket_sizes`` by name; see ``tests/tools/exercises.py``). Without
``--mine`` the tests run the package as usual.

* :func:`bucket_sizes` is the module-level function of ``minisgl/engine/graph.py``;
* :func:`bucket_for` is :class:`minisgl.engine.graph.GraphRunner`'s method;
* :func:`padded` is :class:`minisgl.attention.metadata.BatchMetadata`'s method (read the module
  docstring of ``minisgl/attention/metadata.py`` for what the four index arrays mean).
"""

from __future__ import annotations

import torch  # noqa: F401  (for your padded)

from minisgl.attention.metadata import BatchMetadata
from minisgl.engine.graph import GraphRunner


def bucket_sizes(max_bs: int) -> list[int]:
    """The batch sizes that get a captured graph, ascending, without repeats: 1, 2, 4, 8, then
    every multiple of 8 from 16 up to ``max_bs``, and ``max_bs`` itself even when it is not on
    that ladder. None above ``max_bs``.

    Examples: ``1 -> [1]``, ``3 -> [1, 2, 3]``, ``13 -> [1, 2, 4, 8, 13]``,
    ``32 -> [1, 2, 4, 8, 16, 24, 32]``. ``max_bs < 1`` raises ``ValueError``.
    """
    raise NotImplementedError("exercise l08 bucket_sizes(): write bucket_sizes in lessons/l08/exercise.py")


def bucket_for(self: GraphRunner, num_rows: int) -> int:
    """The smallest bucket in ``self.buckets`` (ascending, what :func:`bucket_sizes` returned)
    that holds ``num_rows`` rows, i.e. the first one ``>= num_rows``. (The runner only asks for
    ``num_rows <= max_bs``, the last bucket; raising ``ValueError`` above it is fine.)"""
    raise NotImplementedError("exercise l08 bucket_for(): write GraphRunner.bucket_for in lessons/l08/exercise.py")


def padded(self: BatchMetadata, batch_size: int, scratch_page: int) -> BatchMetadata:
    """This *decode* batch padded to ``batch_size`` rows, as a new ``BatchMetadata``.

    The real rows stay exactly as they are. Each extra row has one new token and a KV length of
    one token, held in ``scratch_page`` (a page no request ever owns, so padded rows can write
    their garbage K/V there without harming anyone): one page, last-page length 1.

    * ``batch_size < self.batch_size``: ``ValueError``; a batch that is not decode
      (``self.is_decode``, a property, false): ``ValueError``. ``batch_size ==
      self.batch_size`` adds no rows.
    * Build it with ``BatchMetadata(qo_indptr=..., kv_indptr=..., kv_indices=...,
      kv_last_page_len=..., page_size=...)`` (a dataclass of those five fields); extend each
      array of ``self`` with ``torch.cat`` (``self.batch_size``, also a property, is the number
      of real rows). Every array stays ``torch.int32`` on the CPU; ``page_size`` is unchanged.
    * Example: decode rows with ``kv_indptr [0, 2, 3]``, ``kv_indices [7, 2, 5]``,
      ``kv_last_page_len [3, 1]``, padded to 4 rows with scratch page 0: ``qo_indptr [0, 1, 2, 3,
      4]``, ``kv_indptr [0, 2, 3, 4, 5]``, ``kv_indices [7, 2, 5, 0, 0]``, ``kv_last_page_len
      [3, 1, 1, 1]``.
    """
    raise NotImplementedError("exercise l08 padded(): write BatchMetadata.padded in lessons/l08/exercise.py")

