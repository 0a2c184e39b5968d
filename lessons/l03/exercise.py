"""Lesson 3 exercise: batch metadata in CSR form, and the reference paged attention over it.

Write the two functions below, then run ``pytest lessons/l03 --mine``: the lesson's tests run
with your functions in place of the package's (``--mine`` swaps exactly these; see
``tests/tools/exercises.py``). Without ``--mine`` the tests run the package as usual.

* :func:`from_requests` is :class:`minisgl.attention.metadata.BatchMetadata`'s classmethod (it
  takes ``cls``): it describes a ragged batch the way FlashInfer wants it.
* :func:`attend_row` is :class:`minisgl.attention.paged.ReferencePagedBackend`'s
  ``_attend_row``: attention of one request of the batch, read straight from its pages.

Read the module docstring of ``minisgl/attention/metadata.py`` first: it defines the four
index arrays, and the README's worked example gives their numbers for one batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minisgl.attention.dense import dense_causal_attention  # noqa: F401  (for your attend_row)
from minisgl.attention.metadata import BatchMetadata
from minisgl.attention.paged import ReferencePagedBackend
from minisgl.utils import cdiv  # noqa: F401  (cdiv(a, b) == ceil(a / b) for ints)


def from_requests(
    cls: type[BatchMetadata], page_lists: Sequence[Sequence[int]], num_cached: Sequence[int],
    num_new: Sequence[int], page_size: int,
) -> BatchMetadata:
    """Build ``cls(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size)`` for a batch.

    Request ``i`` owns the pages ``page_lists[i]`` (in position order; it may own more than it
    needs yet), has ``num_cached[i]`` tokens in the cache and brings ``num_new[i]`` new ones, so
    after this forward its KV length is ``seq_len = num_cached[i] + num_new[i]``.

    * ``qo_indptr [B+1]``: prefix sums of ``num_new`` (starting at 0).
    * ``kv_indptr [B+1]``: prefix sums of the pages *in use*, ``ceil(seq_len / page_size)`` each.
    * ``kv_indices``: those pages of every request, concatenated in request order (pages
      reserved ahead are left out).
    * ``kv_last_page_len [B]``: tokens in each request's last page, ``1 .. page_size`` (never 0:
      a full last page holds ``page_size``).

    All four are ``torch.int32`` tensors on the CPU.
    Errors (``ValueError``): lists of different lengths or an empty batch (message containing
    ``"need one page list, cached length and new-token count per request"``); a request with
    ``num_new < 1`` (message containing ``"at least one new token"``); a request that owns too few
    pages (message ``"request needs {used} pages for {seq_len} tokens but owns {len(pages)}"``).

    Worked example (page size 4): pages ``[[7, 2], [0, 4, 9], [5, 1]]``, cached ``[0, 8, 4]``,
    new ``[6, 1, 3]`` -> ``qo_indptr [0, 6, 7, 10]``, ``kv_indptr [0, 2, 5, 7]``,
    ``kv_indices [7, 2, 0, 4, 9, 5, 1]``, ``kv_last_page_len [2, 1, 3]``.
    """
    raise NotImplementedError("exercise l03 from_requests(): write BatchMetadata.from_requests in lessons/l03/exercise.py")


def attend_row(self: ReferencePagedBackend, i: int, q: torch.Tensor, out: torch.Tensor, layer_id: int) -> None:
    """Row ``i`` of the batch: its new tokens' queries, causally over its cached and new K/V;
    write the result into ``out`` in place.

    Shapes: ``q, out [T, Hq, D]`` (every request's new tokens, flattened). The pool is
    ``self.pool``: ``pool.k[layer_id], pool.v[layer_id]`` are ``[num_pages, page_size, Hkv, D]``,
    with ``pool.num_kv_heads`` (``Hkv``) and ``pool.head_dim`` (``D``). The new tokens' K/V are
    already stored (``forward`` did it before calling you).

    What ``_plan`` (the package's) prepared for this batch, as plain Python lists / a tensor:

    * ``self._qo``: ``qo_indptr`` as a list: row ``i``'s queries are ``q[_qo[i]:_qo[i+1]]``;
    * ``self._kv``: ``kv_indptr`` as a list; ``self._pages``: ``kv_indices`` as an int64 tensor on
      the pool's device: row ``i``'s pages are ``_pages[_kv[i]:_kv[i+1]]``, in position order;
    * ``self._seq_lens``: a list of ints, each row's KV length after this forward (cached + new).

    The row's new-token count is ``_qo[i+1] - _qo[i]``. Indexing ``pool.k[layer_id]`` with the
    row's page tensor gives ``[num_pages, page_size, Hkv, D]``.

    Read the row's pages, flatten them into ``[num_pages * page_size, Hkv, D]``, keep the first
    ``seq_len`` positions (the rest of the last page is stale), and attend with
    ``dense_causal_attention(q_row, k_row, v_row, num_cached=seq_len - num_new)``.
    Use these planned fields (tests inject bugs by changing them in a subclass's ``plan``).
    """
    raise NotImplementedError("exercise l03 attend_row(): write ReferencePagedBackend._attend_row in lessons/l03/exercise.py")
