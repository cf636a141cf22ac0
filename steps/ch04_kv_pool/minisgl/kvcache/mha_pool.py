from __future__ import annotations

import torch

from minisgl.kernel import store_kv


class MHAKVPool:
    """K and V of every cached token, for every layer, in pages of `page_size` tokens: one
    allocation. A token's *slot* is page * page_size + offset: the page table and batch.out_loc
    hold slots, so the attention code addresses tokens, and only allocation thinks in pages."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.bytes_per_page = self.page_bytes(num_layers, page_size, num_kv_heads, head_dim, dtype)
        self._buffer = torch.zeros(2, num_layers, num_pages, page_size, num_kv_heads, head_dim,
                                   dtype=dtype, device=device)
        self._slot_shape = (num_pages * page_size, num_kv_heads, head_dim)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def k_cache(self, layer_id: int) -> torch.Tensor:
        """[num_slots, num_kv_heads, head_dim]: one layer's keys, indexed by slot."""
        return self._buffer[0, layer_id].view(self._slot_shape)

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._buffer[1, layer_id].view(self._slot_shape)

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor,
                 layer_id: int) -> None:
        store_kv(self.k_cache(layer_id), self.v_cache(layer_id), out_loc, k, v)

    @staticmethod
    def page_bytes(num_layers: int, page_size: int, num_kv_heads: int, head_dim: int,
                   dtype: torch.dtype) -> int:
        """Bytes one page takes: K and V, for every layer."""
        return 2 * num_layers * page_size * num_kv_heads * head_dim * dtype.itemsize
