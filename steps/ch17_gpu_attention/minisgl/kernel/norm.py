from __future__ import annotations

import torch

from .flashinfer_kernels import flashinfer_for


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension. The statistics are taken
    in float32 and the result cast back before the weight multiplies it, in transformers' order,
    so that low-precision inputs round where transformers rounds them. FlashInfer's kernel
    multiplies by the weight before the one rounding: on a GPU in bfloat16 the two differ in
    the last bit of some elements."""
    if x.dim() in (2, 3) and (flashinfer := flashinfer_for(x)) is not None:
        return flashinfer.rmsnorm(x, weight, eps)  # 3-D: [tokens, heads, head_dim] (q/k-norm)
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> None:
    """In place, as FlashInfer's fused_add_rmsnorm: residual += x, then x = rms_norm(residual).
    On the GPU one kernel replaces two: one launch less, and the sum is normalised while it is
    still in registers instead of being read back from memory."""
    if x.dim() == 2 and (flashinfer := flashinfer_for(x)) is not None:
        flashinfer.fused_add_rmsnorm(x, residual, weight, eps)
        return
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps))
