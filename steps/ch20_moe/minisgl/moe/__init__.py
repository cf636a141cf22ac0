"""Mixture-of-experts backends (chapter 20), chosen by name like the attention backends:
`--moe auto|torch|triton`; "auto" takes, on a GPU, the first of AUTO_ORDER that can run there,
and torch on a CPU."""

from __future__ import annotations

import torch

from minisgl.utils import Registry

from .base import BaseMoEBackend, select_experts
from .torch_backend import TorchMoEBackend
from .triton_backend import TritonMoEBackend  # imports no Triton: its kernels load on creation

MOE_BACKENDS: Registry[type[BaseMoEBackend]] = Registry("MoE backend")
MOE_BACKENDS.register("torch")(TorchMoEBackend)
MOE_BACKENDS.register("triton")(TritonMoEBackend)
# What "auto" tries on a GPU, fastest first. On a CPU it takes torch: Triton runs there only in
# its interpreter, a tool for checking the kernel (`--moe triton` with TRITON_INTERPRET=1).
AUTO_ORDER = ("triton", "torch")


def resolve_moe_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend `name` stands for here; an error that says why if it cannot run."""
    if name == "auto":
        if device.type != "cuda":
            return "torch"
        return next(n for n in AUTO_ORDER
                    if MOE_BACKENDS.get(n).unsupported_reason(device, dtype) is None)
    if (reason := MOE_BACKENDS.get(name).unsupported_reason(device, dtype)) is not None:
        raise ValueError(f"--moe {name} cannot run here: {reason}")
    return name


def create_moe_backend(name: str) -> BaseMoEBackend:
    return MOE_BACKENDS.get(name)()
