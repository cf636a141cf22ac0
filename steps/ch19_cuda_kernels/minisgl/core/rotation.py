from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rotation:
    """How an attention layer turns its projection's q and k into attention's: RoPE from
    cos_sin_cache [positions, head_dim] (float32, cos then sin), after Qwen3's per-head RMSNorm
    where q_norm and k_norm are given. The layer applies it, unless the attention backend says
    it will (chapter 19's decode kernel does it on the way in, saving a launch a layer)."""

    cos_sin_cache: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    eps: float = 0.0
