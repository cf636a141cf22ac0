from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.core import Batch
from minisgl.core.rotation import Rotation
from minisgl.kvcache import MHAKVPool


class BaseAttentionBackend(ABC):
    """An attention backend: core.AttentionBackend's forward (what the model calls), plus
    prepare_metadata (what the engine calls once per batch, before the forward).

    Metadata is everything about the batch's shape that all layers share: which query rows
    belong to which request, where each request's keys live in the pool, which row is each
    request's last. Computing it once per batch instead of once per layer is the point.
    """

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype,
                           head_dim: int) -> str | None:
        """Why this backend cannot run here, or None. Asked at start-up, before any weight is
        loaded, so that a wrong choice is an error message and never a crash in a forward."""
        return None

    @classmethod
    def create(cls, pool: MHAKVPool, page_table: torch.Tensor,
               num_qo_heads: int) -> BaseAttentionBackend:
        """The backend for this pool and page table. Kernels that plan a batch ahead of its
        forward need the query-head count then; the torch backend reads it off q, and this
        default constructor ignores it."""
        return cls(pool, page_table)  # type: ignore[call-arg]

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Attach this backend's metadata to batch.attn_metadata."""

    # --- CUDA graphs (chapter 18): decode batches replayed at a few fixed sizes -------------

    def init_graph(self, max_batch_size: int, dummy_row: int) -> None:
        """Allocate the static buffers that captured decode graphs read their metadata from.
        Padding rows of a replayed batch point at page-table row `dummy_row`."""
        raise NotImplementedError(f"{type(self).__name__} has no CUDA-graph decode")

    def capture_metadata(self, batch_size: int) -> object:
        """Decode metadata for a graph of `batch_size` requests, built on the static buffers."""
        raise NotImplementedError(f"{type(self).__name__} has no CUDA-graph decode")

    def prepare_replay(self, batch: Batch, padded_size: int) -> None:
        """Write `batch`'s shape (padded to `padded_size`) into the static buffers, on the
        current stream: the one the graph is replayed on."""
        raise NotImplementedError(f"{type(self).__name__} has no CUDA-graph decode")

    def prepare_in_graph(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """Device work recorded into the captured step, before the layers, from the static
        page-table rows and positions of the batch; by default none."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        """Store k/v at batch.out_loc, then attend q ([num_tokens, q_heads, head_dim]) over each
        request's cached and new keys; returns [num_tokens, q_heads, head_dim]."""

    # --- Chapter 19: the layer's q/k rotation inside the attention kernel ------------------

    def rotates(self, batch: Batch) -> bool:
        """Whether forward_rotating takes this batch; by default never."""
        return False

    def forward_rotating(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         layer_id: int, batch: Batch, rotation: Rotation) -> torch.Tensor:
        """forward() for q and k as the projection wrote them: `rotation` (RoPE, after the
        per-head RMSNorm where it has one) is applied on the way in. Only where rotates()."""
        raise NotImplementedError(f"{type(self).__name__} does not rotate q and k itself")
