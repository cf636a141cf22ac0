from __future__ import annotations

import torch

from minisgl.kernel import silu_and_mul

from .base import BaseOP


class SiluAndMul(BaseOP):
    """[gate | up] -> silu(gate) * up: the activation of a SwiGLU MLP after gate_up_proj."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
