from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.core import Batch


class BaseAttentionBackend(ABC):
    """An attention backend: core.AttentionBackend's forward (what the model calls), plus
    prepare_metadata (what the engine calls once per batch, before the forward).

    Metadata is everything about the batch's shape that all layers share: which query rows
    belong to which request, where each request's keys live in the pool, which row is each
    request's last. Computing it once per batch instead of once per layer is the point.
    """

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Attach this backend's metadata to batch.attn_metadata."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        """Store k/v at batch.out_loc, then attend q ([num_tokens, q_heads, head_dim]) over each
        request's cached and new keys; returns [num_tokens, q_heads, head_dim]."""
