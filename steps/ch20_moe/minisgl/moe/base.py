"""What every MoE backend shares: the routing, exactly as transformers' Qwen3-MoE routes."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top_k experts and their weights: softmax over all experts in float32, the
    k largest, renormalised to sum to 1 when the config's norm_topk_prob says so.
    Returns (weights [tokens, top_k] float32, expert ids [tokens, top_k] int64)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class BaseMoEBackend(ABC):
    """x [tokens, hidden] through its experts: w13 [experts, 2 * inter, hidden] holds each
    expert's gate and up projections stacked, w2 [experts, hidden, inter] its down projection.
    With tensor parallelism `inter` is this rank's slice; the layer sums the ranks' outputs."""

    @abstractmethod
    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor: ...

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this backend cannot run here, or None."""
        return None
