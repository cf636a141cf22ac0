"""A mixture-of-experts MLP: a router picks each token's top_k experts, and the token's output is
the routing-weighted sum of those experts' gated MLPs. Tensor parallelism splits each expert
like a dense MLP (one all-reduce); the router is replicated, so every rank routes alike."""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_comm, get_tp_info

from .base import BaseOP, meta_param
from .linear import Linear


class Experts(BaseOP):
    """The stacked weights of all experts: w13 [experts, 2 * inter, hidden] holds each expert's
    gate rows then its up rows, w2 [experts, hidden, inter] its down projection; `inter` is this
    rank's slice."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        self.w13 = meta_param(num_experts, 2 * intermediate_size, hidden_size)
        self.w2 = meta_param(num_experts, hidden_size, intermediate_size)


class MoE(BaseOP):
    """Qwen3-MoE's sparse MLP block. The computation itself is the MoE backend's (torch loop or
    fused kernel), chosen by the engine and read from the global Context like attention's."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
                 renormalize: bool) -> None:
        inter = get_tp_info().shard(intermediate_size, "moe_intermediate_size",
                                    "each rank holds an equal slice of every expert")
        self.gate = Linear(hidden_size, num_experts)  # the router, replicated
        self.experts = Experts(num_experts, hidden_size, inter)
        self._top_k, self._renormalize = top_k, renormalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        backend = get_global_ctx().moe_backend
        if backend is None:
            raise RuntimeError("this model has experts but the Context has no MoE backend")
        router_logits = self.gate.forward(x)
        out = backend.forward(x, router_logits, self.experts.w13, self.experts.w2,
                              self._top_k, self._renormalize)
        return get_comm().all_reduce(out)  # each rank summed its slice of every expert
