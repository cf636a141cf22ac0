from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.core import Batch
from minisgl.kvcache import MHAKVPool

from .base import BaseAttentionBackend


@dataclass
class PaddedGroup:
    """Requests padded together into one [size, heads, max_extend, max_seq] problem."""

    query_rows: torch.Tensor  # [size * max_extend]: flat row of request b's i-th query
    token_rows: torch.Tensor  # [real queries]: their flat rows, in the padded grid's order
    grid_rows: torch.Tensor  # [real queries]: where each of them sits in the padded grid
    key_slots: torch.Tensor  # [size * max_seq]: pool slot of request b's j-th key
    mask: torch.Tensor  # [size, 1, max_extend, max_seq]: query i may attend key j


@dataclass
class TorchAttnMetadata:
    last_indices: torch.Tensor  # [batch_size]: each request's last row in the flat token dim
    groups: list[PaddedGroup]


class TorchAttentionBackend(BaseAttentionBackend):
    """The reference backend, in plain PyTorch over the paged pool: ragged requests padded to
    one [batch, heads, max_extend, max_seq] problem, one scaled_dot_product_attention call, a
    mask that hides padding and lets query i of request b see keys 0 .. cached_len_b + i. A
    mixed batch pads its one-token rows and its prompts as two groups, so that a decode row
    does not cost a whole prompt's length."""

    def __init__(self, pool: MHAKVPool, page_table: torch.Tensor) -> None:
        self.pool, self.page_table = pool, page_table

    def prepare_metadata(self, batch: Batch) -> None:
        extend = torch.tensor([r.extend_len for r in batch.reqs])
        cached = torch.tensor([r.cached_len for r in batch.reqs])
        rows = torch.tensor([r.table_idx for r in batch.reqs])
        starts = extend.cumsum(0) - extend
        groups = [self._pad(extend[g], cached[g], starts[g], rows[g])
                  for g in (extend == 1, extend > 1) if g.any()]
        batch.attn_metadata = TorchAttnMetadata(
            (starts + extend - 1).to(self.page_table.device), groups)

    def _pad(self, extend: torch.Tensor, cached: torch.Tensor, starts: torch.Tensor,
             rows: torch.Tensor) -> PaddedGroup:
        device = self.page_table.device
        seq = cached + extend
        max_extend, max_seq = int(extend.max()), int(seq.max())
        i = torch.arange(max_extend)[None, :]  # query index within its request
        j = torch.arange(max_seq)[None, :]  # key index within its request
        query_valid = i < extend[:, None]
        query_rows = torch.where(query_valid, starts[:, None] + i, 0)
        key_slots = self.page_table[rows.to(device), :max_seq].long()
        visible = (j[:, None, :] <= (cached[:, None] + i)[:, :, None]) & (j < seq[:, None])[:, None]
        return PaddedGroup(
            query_rows=query_rows.flatten().to(device),
            token_rows=query_rows[query_valid].to(device),
            grid_rows=query_valid.flatten().nonzero().squeeze(1).to(device),
            key_slots=key_slots.flatten(),
            mask=visible[:, None].to(device),
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        meta: TorchAttnMetadata = batch.attn_metadata  # type: ignore[assignment]
        self.pool.store_kv(k, v, batch.out_loc, layer_id)
        if len(meta.groups) == 1:  # a plain prefill or decode batch: its grid is in token order
            return self._attend(q, meta.groups[0], layer_id)
        out = torch.empty_like(q)
        for group in meta.groups:
            out[group.token_rows] = self._attend(q, group, layer_id)
        return out

    def _attend(self, q: torch.Tensor, group: PaddedGroup, layer_id: int) -> torch.Tensor:
        """The group's real queries' outputs, in the order of group.token_rows."""
        size, _, max_extend, max_seq = group.mask.shape
        # Gather into [batch, heads, rows, head_dim] for SDPA; GQA repeats KV heads inside it.
        queries = q.index_select(0, group.query_rows).view(size, max_extend, *q.shape[1:])
        keys = self.pool.k_cache(layer_id).index_select(0, group.key_slots)
        values = self.pool.v_cache(layer_id).index_select(0, group.key_slots)
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys.view(size, max_seq, *keys.shape[1:]).transpose(1, 2),
            values.view(size, max_seq, *values.shape[1:]).transpose(1, 2), attn_mask=group.mask,
            enable_gqa=True)
        return out.transpose(1, 2).reshape(size * max_extend, *q.shape[1:]).index_select(
            0, group.grid_rows)
