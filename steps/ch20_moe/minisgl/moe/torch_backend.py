"""The reference: a Python loop over the experts that received tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import BaseMoEBackend, select_experts


class TorchMoEBackend(BaseMoEBackend):
    """Clear and slow: one small GEMM chain per chosen expert, and 1 + (chosen experts) host
    syncs: one to learn which experts were chosen, then one per nonzero() to size its rows."""

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
        weights, ids = select_experts(router_logits, top_k, renormalize)
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():
            token, slot = (ids == expert).nonzero(as_tuple=True)
            gate, up = F.linear(x[token], w13[expert]).chunk(2, dim=-1)
            h = F.linear(F.silu(gate) * up, w2[expert])
            # transformers rounds the routing weight to the model's dtype before multiplying
            out.index_add_(0, token, h * weights[token, slot, None].to(x.dtype))
        return out
