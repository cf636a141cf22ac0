"""Compute kernels behind the layers. Each op here is the PyTorch reference with the interface of
the GPU kernel that later chapters put behind it (FlashInfer, sgl_kernel, our own CUDA)."""

from .activation import silu_and_mul
from .index import indexing
from .norm import fused_add_rms_norm, rms_norm
from .rotary import apply_rotary_inplace
