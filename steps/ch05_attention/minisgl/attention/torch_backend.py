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
    query_rows: torch.Tensor  # [batch_size * max_extend]: flat row of request b's i-th query
    output_rows: torch.Tensor  # [num_tokens]: where each real token sits in that padded grid
    key_slots: torch.Tensor  # [batch_size * max_seq]: pool slot of request b's j-th key
    mask: torch.Tensor  # [batch_size, 1, max_extend, max_seq]: query i may attend key j


class TorchAttentionBackend(BaseAttentionBackend):
    """The reference backend, in plain PyTorch over the paged pool: ragged requests padded to
    one [batch, heads, max_extend, max_seq] problem, one scaled_dot_product_attention call, a
    mask that hides padding and lets query i of request b see keys 0 .. cached_len_b + i."""

    def __init__(self, pool: MHAKVPool, page_table: torch.Tensor) -> None:
        self.pool, self.page_table = pool, page_table

    def prepare_metadata(self, batch: Batch) -> None:
        device = self.page_table.device
        extend = torch.tensor([r.extend_len for r in batch.reqs])
        cached = torch.tensor([r.cached_len for r in batch.reqs])
        seq = cached + extend
        starts = extend.cumsum(0) - extend
        max_extend, max_seq = int(extend.max()), int(seq.max())
        i = torch.arange(max_extend)[None, :]  # query index within its request
        j = torch.arange(max_seq)[None, :]  # key index within its request
        query_valid = i < extend[:, None]
        query_rows = torch.where(query_valid, starts[:, None] + i, 0)
        rows = torch.tensor([r.table_idx for r in batch.reqs], device=device)
        key_slots = self.page_table[rows, :max_seq].long()
        visible = (j[:, None, :] <= (cached[:, None] + i)[:, :, None]) & (j < seq[:, None])[:, None]
        batch.attn_metadata = TorchAttnMetadata(
            last_indices=(starts + extend - 1).to(device),
            query_rows=query_rows.flatten().to(device),
            output_rows=query_valid.flatten().nonzero().squeeze(1).to(device),
            key_slots=key_slots.flatten(),
            mask=visible[:, None].to(device),
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        meta: TorchAttnMetadata = batch.attn_metadata  # type: ignore[assignment]
        self.pool.store_kv(k, v, batch.out_loc, layer_id)
        size, _, max_extend, max_seq = meta.mask.shape
        # Gather into [batch, heads, rows, head_dim] for SDPA; GQA repeats KV heads inside it.
        queries = q.index_select(0, meta.query_rows).view(size, max_extend, *q.shape[1:])
        keys = self.pool.k_cache(layer_id).index_select(0, meta.key_slots)
        values = self.pool.v_cache(layer_id).index_select(0, meta.key_slots)
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys.view(size, max_seq, *k.shape[1:]).transpose(1, 2),
            values.view(size, max_seq, *v.shape[1:]).transpose(1, 2), attn_mask=meta.mask,
            enable_gqa=True)
        return out.transpose(1, 2).reshape(size * max_extend, *q.shape[1:]).index_select(
            0, meta.output_rows)
