from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cuda_kernels
from .activation import silu_and_mul


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias), as F.linear. A decode step of a few requests multiplies a
    handful of rows by every weight of the model: chapter 19's GEMV streams the weight once
    instead of padding the rows up to cuBLAS's tiles."""
    if cuda_kernels.target_for(x) and (y := cuda_kernels.gemv(x, weight)) is not None:
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for weight = [gate; up]: SwiGLU's gate_up_proj and its
    activation. At a few rows of bfloat16 the GEMV computes both halves of each output column
    and multiplies them as it writes: one launch instead of two, and no [rows, 2 * n]
    intermediate. Otherwise the matmul, then the activation op."""
    if cuda_kernels.target_for(x) and (y := cuda_kernels.gemv(x, weight, gated=True)) is not None:
        return y
    return silu_and_mul(F.linear(x, weight))
