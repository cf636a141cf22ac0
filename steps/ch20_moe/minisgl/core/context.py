from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .batch import Batch


class AttentionBackend(Protocol):
    """The one call the model makes into attention. Backends live in an upper module
    (minisgl.attention); this interface sits here so that core and layers never import it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor: ...


class MoEBackend(Protocol):
    """The one call a mixture-of-experts layer makes (chapter 20). Backends live in an upper
    module (minisgl.moe); this interface sits here for the same reason as AttentionBackend's."""

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor: ...


@dataclass
class Context:
    """Process-global state of the running engine. The model's forward() takes no arguments:
    every layer reads the current batch and the attention backend from here."""

    attn_backend: AttentionBackend
    moe_backend: MoEBackend | None = None  # set by the engine when the model has experts
    _batch: Batch | None = field(default=None, init=False)

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("no batch is being forwarded: use `with ctx.forward_batch(batch):`")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        if self._batch is not None:
            raise RuntimeError("forward_batch does not nest: a batch is already being forwarded")
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context | None) -> None:
    """Install `ctx` as this process's context (the engine created last owns it); None clears
    it, so that a shut-down engine's memory can be freed."""
    global _GLOBAL_CTX
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    if _GLOBAL_CTX is None:
        raise RuntimeError("no global Context: create an Engine (or call set_global_ctx) first")
    return _GLOBAL_CTX
