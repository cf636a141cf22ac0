"""FlashInfer's fused kernels behind the reference ops, for CUDA tensors in float16/bfloat16 when
flashinfer-python is installed: RMSNorm (alone, and fused with the residual add), RoPE, and
SiLU-and-mul each become one launch instead of the reference's three to twenty."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import torch

INSTALLED = importlib.util.find_spec("flashinfer") is not None
# The head sizes FlashInfer's RoPE kernel is compiled for (DISPATCH_HEAD_DIM in its utils.cuh);
# others (the tiny test models' 32) take the reference path.
ROPE_HEAD_DIMS = (64, 128, 256, 512)
_module: ModuleType | None = None


def flashinfer_for(x: torch.Tensor) -> ModuleType | None:
    """The flashinfer package when its kernels can take `x`, else None (the reference runs)."""
    global _module
    if not (INSTALLED and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)):
        return None
    if _module is None:
        import flashinfer  # each kernel is compiled at its first use and cached on disk

        _module = flashinfer
    return _module
