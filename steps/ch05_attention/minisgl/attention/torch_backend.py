from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.core import Batch
from minisgl.kvcache import MHAKVPool

from .base import BaseAttentionBackend


@dataclass
class TorchAttnMetadata:
    last_indices: torch.Tensor  # [batch_size]: each request's last row in the flat token dim
    query_rows: torch.Tensor  # [batch_size, max_extend]: flat row of each request's i-th query
    query_valid: torch.Tensor  # [batch_size, max_extend]: False where a row is only padding
    key_slots: torch.Tensor  # [batch_size, max_seq]: pool slot of each request's j-th key
    mask: torch.Tensor  # [batch_size, 1, max_extend, max_seq]: query i may attend key j


class TorchAttentionBackend(BaseAttentionBackend):
    """The reference backend, in plain PyTorch over the paged pool.

    Requests of different lengths (ragged) are padded to one [batch, heads, max_extend, max_seq]
    problem so that one scaled_dot_product_attention call serves the whole batch; the mask
    hides padding and, for request b, lets query i (at position cached_len_b + i) see keys
    0 .. cached_len_b + i. The same code serves prefill, prefill on top of a cached prefix, and
    decode (max_extend = 1).
    """

    def __init__(self, pool: MHAKVPool, page_table: torch.Tensor) -> None:
        self.pool, self.page_table = pool, page_table

    def prepare_metadata(self, batch: Batch) -> None:
        device = self.page_table.device
        extend = torch.tensor([r.extend_len for r in batch.reqs])
        cached = torch.tensor([r.cached_len for r in batch.reqs])
        seq = cached + extend
        starts = extend.cumsum(0) - extend
        i = torch.arange(int(extend.max()))[None, :]  # query index within its request
        j = torch.arange(int(seq.max()))[None, :]  # key index within its request
        query_valid = i < extend[:, None]
        query_rows = torch.where(query_valid, starts[:, None] + i, 0)
        rows = torch.tensor([r.table_idx for r in batch.reqs], device=device)
        key_slots = self.page_table[rows, : int(seq.max())].long()
        visible = (j[:, None, :] <= (cached[:, None] + i)[:, :, None]) & (j < seq[:, None])[:, None]
        batch.attn_metadata = TorchAttnMetadata(
            last_indices=(starts + extend - 1).to(device),
            query_rows=query_rows.to(device),
            query_valid=query_valid.to(device),
            key_slots=key_slots,
            mask=visible[:, None].to(device),
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        meta: TorchAttnMetadata = batch.attn_metadata  # type: ignore[assignment]
        self.pool.store_kv(k, v, batch.out_loc, layer_id)
        # [batch, heads, rows, head_dim] for SDPA; GQA repeats KV heads inside the call.
        queries = q[meta.query_rows].transpose(1, 2)
        keys = self.pool.k_cache(layer_id)[meta.key_slots].transpose(1, 2)
        values = self.pool.v_cache(layer_id)[meta.key_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.mask,
                                             enable_gqa=True)
        return out.transpose(1, 2)[meta.query_valid]
