from __future__ import annotations

import torch
import torch.nn.functional as F

from .flashinfer_kernels import flashinfer_for


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: x = [gate | up] along the last dimension -> silu(gate) * up."""
    # FlashInfer reads each half 16 bytes at a time: a half that is not a whole number of
    # 16-byte pieces puts the next row's loads off their alignment (a misaligned-address fault).
    half_bytes = x.shape[-1] // 2 * x.element_size()
    if half_bytes % 16 == 0 and (flashinfer := flashinfer_for(x)) is not None:
        return flashinfer.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
