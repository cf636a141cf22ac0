"""Shared by the fused-MoE test modules (chapter 20): minisgl.kernel.fused_moe with its kernels
built the way a module's tests need, whatever another module of the session did before.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a kernel (so at the kernel module's
import) and again while an interpreted kernel runs. So a fixture sets or clears the variable for
the duration of its module's tests and re-imports the kernel module if it was built the other
way. A CPU test session has the variable set from the start (tests/conftest.py): Triton's own
library (triton.language) is decorated once, when first imported, and must be interpreted too."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

KERNEL_MODULE = "minisgl.kernel.fused_moe"


@contextmanager
def fused_moe_kernels(interpret: bool) -> Iterator[ModuleType]:
    """The kernel module, interpreted on the CPU (interpret=True) or compiled for the GPU, with
    TRITON_INTERPRET set accordingly until the block ends."""
    saved = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        module = importlib.import_module(KERNEL_MODULE)
        if module.INTERPRETED != interpret:
            module = importlib.reload(module)  # decorates the kernels again, the wanted way
        assert module.INTERPRETED == interpret
        yield module
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
