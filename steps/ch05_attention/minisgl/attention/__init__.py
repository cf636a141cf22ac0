"""Attention backends over the paged KV pool, chosen by name."""

from __future__ import annotations

import torch

from minisgl.kvcache import MHAKVPool
from minisgl.utils import Registry

from .base import BaseAttentionBackend
from .torch_backend import TorchAttentionBackend, TorchAttnMetadata

ATTENTION_BACKENDS: Registry[type[BaseAttentionBackend]] = Registry("attention backend")
ATTENTION_BACKENDS.register("torch")(TorchAttentionBackend)


def create_attention_backend(name: str, pool: MHAKVPool,
                             page_table: torch.Tensor) -> BaseAttentionBackend:
    return ATTENTION_BACKENDS.get(name)(pool, page_table)
