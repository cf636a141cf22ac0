from __future__ import annotations

import torch
import torch.nn.functional as F

from .flashinfer_kernels import flashinfer_for


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: x = [gate | up] along the last dimension -> silu(gate) * up."""
    if (flashinfer := flashinfer_for(x)) is not None:
        return flashinfer.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
