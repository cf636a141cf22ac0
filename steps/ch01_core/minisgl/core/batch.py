from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from .req import Req

Phase = Literal["prefill", "decode"]


class AttentionMetadata(Protocol):
    """What the model side reads from an attention backend's per-batch metadata."""

    # Index of each request's last token in the flattened batch: the rows the LM head scores.
    last_indices: torch.Tensor


@dataclass
class Batch:
    """The requests of one forward pass, flattened into one token dimension.

    `reqs` and `phase` are chosen by whoever builds the batch (later: the scheduler), the token
    tensors are filled in before the forward, and the attention backend attaches its metadata.
    """

    reqs: list[Req]
    phase: Phase
    input_ids: torch.Tensor = field(init=False)  # [num_tokens], the tokens to compute
    positions: torch.Tensor = field(init=False)  # [num_tokens], each token's position in its req
    out_loc: torch.Tensor = field(init=False)  # [num_tokens], KV-pool slot each token writes to
    attn_metadata: AttentionMetadata = field(init=False)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def size(self) -> int:
        return len(self.reqs)
