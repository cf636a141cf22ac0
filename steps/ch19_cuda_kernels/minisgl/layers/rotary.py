from __future__ import annotations

import math
from typing import Any

import torch

from minisgl.kernel import apply_rotary_inplace, qk_norm_rope

from .base import BaseOP
from .norm import RMSNorm


def rope_inv_freq(head_dim: int, base: float,
                  scaling: dict[str, Any] | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of RoPE and the factor applied to cos/sin, for the scaling variants
    of transformers' rope_parameters that Llama 3 and Qwen3 checkpoints use."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        return _llama3(inv_freq, factor, scaling), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, head_dim, base, factor, scaling)
    raise ValueError(f"unsupported rope_type {kind!r}; supported: default, linear, llama3, yarn")


def _llama3(inv_freq: torch.Tensor, factor: float, scaling: dict[str, Any]) -> torch.Tensor:
    # Long wavelengths (beyond the original context) are slowed down by `factor`, short ones kept;
    # wavelengths in between blend the two smoothly.
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    if high == low:  # no blending band: a hard switch at the original context length
        return torch.where(wavelen < original / high, inv_freq, inv_freq / factor)
    smooth = ((original / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _yarn(inv_freq: torch.Tensor, head_dim: int, base: float, factor: float,
          scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    # Dimensions that rotate many times within the original context keep their frequency, those
    # that rotate less than once are interpolated by `factor`, a linear ramp joins the two.
    original = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float) - low) / max(high - low, 0.001))
    keep = 1 - ramp.clamp(0, 1)
    inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, float(attention_factor)


class RotaryEmbedding(BaseOP):
    """Rotates q and k by their token positions, reading a precomputed cos/sin table. The table
    is not a parameter (its name starts with _), so checkpoints neither hold nor need it."""

    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: dict[str, Any] | None = None) -> None:
        inv_freq, attention_factor = rope_inv_freq(head_dim, base, scaling)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
        self.head_dim = head_dim
        self._cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1) * attention_factor

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Positions are bounded by max_seq_len when a request is admitted, not here: checking them
        # would cost a device-to-host sync in every layer of every step.
        apply_rotary_inplace(positions, q, k, self.head_dim, self._cos_sin_cache)
        return q, k

    def forward_normed(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       q_norm: RMSNorm, k_norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3: each head of q and k through its RMSNorm first, then the rotation — one kernel
        of ours on a GPU (chapter 19) instead of three."""
        return qk_norm_rope(positions, q, k, self.head_dim, self._cos_sin_cache, q_norm.weight,
                            k_norm.weight, q_norm.eps)
