"""Lesson 3: the block-tensor KV layout that paged attention kernels read directly.

Per layer, K and V are ``[num_pages, page_size, H_kv, D]`` ("NHD": page, token in page, head,
dim). It is the same memory as lesson 2's token-flat ``[num_pages * page_size, H_kv, D]``,
viewed so that a kernel can go from a page id in a block table straight to a contiguous tile of
``page_size`` tokens. "Page" and "block" mean the same thing here.
"""

from __future__ import annotations

__lesson__ = 3

import torch

from minisgl.config import ModelConfig


class PagedKVPool:
    """Pages ``0 .. num_pages - 1`` are the ones an allocator hands out. With ``scratch_page``
    (lesson 8) the tensors hold one more page, ``scratch_page == num_pages``, that no request
    ever owns: the padded rows of a captured decode batch write and read there, so they can
    never touch a real request's KV."""

    def __init__(
        self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", scratch_page: bool = False,
    ) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.scratch_page: int | None = num_pages if scratch_page else None
        shape = (num_pages + int(scratch_page), page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @classmethod
    def for_model(
        cls, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: str | torch.device,
        scratch_page: bool = False,
    ) -> PagedKVPool:
        return cls(config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim, dtype, device,
                   scratch_page)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v [T, Hkv, D]`` at token slots ``[T]`` (slot = page * page_size + offset)."""
        self.k[layer_id].view(-1, self.num_kv_heads, self.head_dim)[slots] = k
        self.v[layer_id].view(-1, self.num_kv_heads, self.head_dim)[slots] = v
