from __future__ import annotations

import torch

from minisgl.core import get_global_ctx

from .base import BaseOP
from .norm import RMSNorm
from .rotary import RotaryEmbedding


class AttentionLayer(BaseOP):
    """Everything between the fused qkv projection and o_proj: split q/k/v, Qwen3's per-head
    q/k-norm, RoPE, then the attention backend found in the global Context.

    The norms and the rotary table belong to the enclosing block (their weights are named
    `self_attn.q_norm.weight`, ...), so they are held privately here.
    """

    def __init__(self, layer_id: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 rotary: RotaryEmbedding, q_norm: RMSNorm | None = None,
                 k_norm: RMSNorm | None = None) -> None:
        if num_q_heads % num_kv_heads:
            raise ValueError(f"{num_q_heads} query heads do not group evenly over "
                             f"{num_kv_heads} KV heads")
        self.layer_id = layer_id
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self._rotary, self._q_norm, self._k_norm = rotary, q_norm, k_norm

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        q_size, kv_size = self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        if self._q_norm is not None and self._k_norm is not None:
            q = self._q_norm.forward(q.view(-1, self.num_q_heads, self.head_dim)).flatten(1)
            k = self._k_norm.forward(k.view(-1, self.num_kv_heads, self.head_dim)).flatten(1)
        q, k = self._rotary.forward(ctx.batch.positions, q, k)
        out = ctx.attn_backend.forward(q.view(-1, self.num_q_heads, self.head_dim),
                                       k.view(-1, self.num_kv_heads, self.head_dim),
                                       v.view(-1, self.num_kv_heads, self.head_dim),
                                       self.layer_id, ctx.batch)
        return out.reshape(-1, q_size)
