from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, computed in float32 as
    transformers does, so float16/bfloat16 inputs round once at the end."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> None:
    """In place, as FlashInfer's fused_add_rmsnorm: residual += x, then x = rms_norm(residual).
    One kernel instead of two saves a full read and write of the hidden states on the GPU."""
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps))
