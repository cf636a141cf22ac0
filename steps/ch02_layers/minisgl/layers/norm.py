from __future__ import annotations

import torch

from minisgl.kernel import fused_add_rms_norm, rms_norm

from .base import BaseOP, meta_param


class RMSNorm(BaseOP):
    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = meta_param(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class FusedAddRMSNorm(RMSNorm):
    """The pre-norm of a decoder block, fused with the residual add of the block before it:
    forward(x, None) starts the residual stream; forward(x, residual) adds x into residual and
    normalises the sum, in place, returning (normed, residual) for the next sub-block."""

    def forward(self, x: torch.Tensor,  # type: ignore[override]
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm(x, self.weight, self.eps), x
        fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual
