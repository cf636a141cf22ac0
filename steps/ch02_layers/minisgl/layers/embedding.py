from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernel import indexing

from .base import BaseOP, meta_param


class Embedding(BaseOP):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        self.weight = meta_param(num_embeddings, embedding_dim)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return indexing(self.weight, token_ids)


class LMHead(BaseOP):
    """Hidden states -> logits over the vocabulary. With tied embeddings (SmolLM2) it reuses the
    embedding matrix and declares no weight of its own, so the checkpoint needs no lm_head."""

    def __init__(self, vocab_size: int, hidden_size: int,
                 tied_embedding: Embedding | None = None) -> None:
        self._tied_embedding = tied_embedding  # private: not a child, its weight is not ours
        if tied_embedding is None:
            self.weight = meta_param(vocab_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._tied_embedding.weight if self._tied_embedding is not None else self.weight
        return F.linear(x, weight)
