from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cuda_kernels


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias), as F.linear. A decode step of a few requests multiplies a
    handful of rows by every weight of the model: chapter 19's GEMV streams the weight once
    instead of padding the rows up to cuBLAS's tiles."""
    if cuda_kernels.target_for(x) and (y := cuda_kernels.gemv(x, weight)) is not None:
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)
