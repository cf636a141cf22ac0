from __future__ import annotations

import torch

from minisgl.distributed import get_comm, get_tp_info
from minisgl.kernel import indexing, linear

from .base import BaseOP, meta_param


def vocab_shard(vocab_size: int) -> tuple[int, int]:
    """(start, rows) of this rank's slice of the vocabulary: ceil(vocab / ranks) rows each, the
    last rank's slice padded with zero rows where the vocabulary runs out."""
    tp = get_tp_info()
    rows = -(-vocab_size // tp.size)
    return tp.rank * rows, rows


class Embedding(BaseOP):
    """Vocab-parallel: each rank holds a slice of the rows, looks up the ids that fall in it
    (zeros for the others), and an all-reduce sums the slices into the full embedding."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        self.num_embeddings = num_embeddings
        self.vocab_range = vocab_shard(num_embeddings)
        self.weight = meta_param(self.vocab_range[1], embedding_dim)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if get_tp_info().size == 1:
            return indexing(self.weight, token_ids)
        return get_comm().all_reduce(indexing(self.weight, token_ids, self.vocab_range))


class LMHead(BaseOP):
    """Hidden states -> logits over the vocabulary, vocab-parallel like the embedding: each
    rank scores its slice of the vocabulary and an all-gather joins the slices. With tied
    embeddings (SmolLM2) it reuses the embedding's slice and declares no weight of its own."""

    def __init__(self, vocab_size: int, hidden_size: int,
                 tied_embedding: Embedding | None = None) -> None:
        self.vocab_size = vocab_size
        self._tied_embedding = tied_embedding  # private: not a child, its weight is not ours
        if tied_embedding is None:
            self.weight = meta_param(vocab_shard(vocab_size)[1], hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._tied_embedding.weight if self._tied_embedding is not None else self.weight
        logits = linear(x, weight)
        if get_tp_info().size == 1:
            return logits
        return get_comm().all_gather(logits)[:, : self.vocab_size]  # drop the padding rows
