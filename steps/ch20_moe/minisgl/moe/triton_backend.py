"""The fused backend: the routing of base.select_experts, then kernel/fused_moe.py's Triton
kernels (two grouped GEMMs and a sum over the chosen experts)."""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from .base import BaseMoEBackend, select_experts

KERNEL_MODULE = "minisgl.kernel.fused_moe"


def interpreter_enabled() -> bool:
    """Whether our Triton kernels run in Triton's CPU interpreter in this process. Triton reads
    TRITON_INTERPRET (1/true/on/yes) when `@triton.jit` decorates a kernel, which fixes the
    choice once the kernel module is imported, and again while an interpreted kernel runs: the
    variable must be set before minisgl starts and stay set."""
    if os.environ.get("TRITON_INTERPRET", "").lower() not in ("1", "true", "on", "yes"):
        return False
    module = sys.modules.get(KERNEL_MODULE)
    return module is None or module.INTERPRETED


class TritonMoEBackend(BaseMoEBackend):
    """One launch per projection for all experts, no host sync: the shape of the work depends
    on the batch size only, so it runs inside a CUDA graph."""

    def __init__(self) -> None:
        # Imported here, not at module level: importing decorates the kernels, and the
        # interpreter must be chosen (TRITON_INTERPRET) before that happens.
        from minisgl.kernel.fused_moe import fused_moe

        self._fused_moe = fused_moe

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
        weights, ids = select_experts(router_logits, top_k, renormalize)
        return self._fused_moe(x, w13, w2, weights, ids)

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "the package triton is not installed: pip install triton"
        if device.type == "cuda" or (device.type == "cpu" and interpreter_enabled()):
            return None
        return (f"Triton compiles kernels for GPUs, and the device is {device}; on a CPU they run "
                "only in Triton's interpreter, enabled by TRITON_INTERPRET=1 in the environment "
                "before minisgl starts (slow: for checking the kernel, not for serving)")
