"""Attention backends over the paged KV pool, chosen by name (--attn)."""

from __future__ import annotations

import torch

from minisgl.kvcache import MHAKVPool
from minisgl.utils import Registry

from .base import BaseAttentionBackend
from .fa_backend import FlashAttentionBackend
from .flashinfer_backend import FlashInferBackend, FlashInferMetadata
from .torch_backend import TorchAttentionBackend, TorchAttnMetadata

ATTENTION_BACKENDS: Registry[type[BaseAttentionBackend]] = Registry("attention backend")
ATTENTION_BACKENDS.register("torch")(TorchAttentionBackend)
ATTENTION_BACKENDS.register("flashinfer")(FlashInferBackend)
ATTENTION_BACKENDS.register("fa")(FlashAttentionBackend)
# What "auto" tries, in order; torch runs anywhere. flashinfer and fa share their decode and
# differ only in prefill kernels; flashinfer comes first because it also runs off Hopper, so
# every GPU gets the same backend (and fa, Hopper-only, is never reached).
AUTO_ORDER = ("flashinfer", "fa", "torch")


def resolve_attention_backend(name: str, device: torch.device, dtype: torch.dtype,
                              head_dim: int) -> str:
    """The backend `name` if it can run here ("auto": the first of AUTO_ORDER that can);
    otherwise a ValueError that says why and what to use instead."""
    if name == "auto":
        return next(n for n in AUTO_ORDER
                    if ATTENTION_BACKENDS.get(n).unsupported_reason(device, dtype, head_dim) is None)
    reason = ATTENTION_BACKENDS.get(name).unsupported_reason(device, dtype, head_dim)
    if reason is not None:
        raise ValueError(f"attention backend {name!r} cannot run here: {reason} "
                         "(--attn torch runs everywhere; --attn auto picks what can)")
    return name


def create_attention_backend(name: str, pool: MHAKVPool, page_table: torch.Tensor,
                             num_qo_heads: int) -> BaseAttentionBackend:
    return ATTENTION_BACKENDS.get(name).create(pool, page_table, num_qo_heads)
