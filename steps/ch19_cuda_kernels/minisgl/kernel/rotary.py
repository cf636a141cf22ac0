from __future__ import annotations

import torch

from . import cuda_kernels
from .flashinfer_kernels import ROPE_HEAD_DIMS, flashinfer_for
from .norm import rms_norm


def apply_rotary_inplace(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                         head_size: int, cos_sin_cache: torch.Tensor) -> None:
    """Rotate query and key in place, FlashInfer's apply_rope_with_cos_sin_cache_inplace in the
    "neox" (rotate-half) layout that transformers uses: dimension i pairs with i + head_size/2.

    query: [num_tokens, num_q_heads * head_size], key: [num_tokens, num_kv_heads * head_size],
    cos_sin_cache: [max_position, head_size] holding cos in the first half and sin in the second.
    """
    if head_size in ROPE_HEAD_DIMS and (flashinfer := flashinfer_for(query)) is not None:
        flashinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size,
                                                         cos_sin_cache, is_neox=True)
        return
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # each [num_tokens, head_size / 2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x in (query, key):
        heads = x.view(x.shape[0], -1, head_size)
        x1, x2 = heads.chunk(2, dim=-1)
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        heads.copy_(rotated)


def qk_norm_rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                 cos_sin_cache: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's attention inputs: RMSNorm over each head of query and key, then the rotation.
    Returns the rotated (query, key): in place, by one kernel of ours (chapter 19) where it
    runs; otherwise new tensors from the three reference ops (two norms and the rotation)."""
    if cuda_kernels.target_for(query) and cuda_kernels.qk_norm_rope(
            positions, query, key, head_size, q_weight, k_weight, eps, cos_sin_cache):
        return query, key
    query = rms_norm(query.view(len(query), -1, head_size), q_weight, eps).flatten(1)
    key = rms_norm(key.view(len(key), -1, head_size), k_weight, eps).flatten(1)
    apply_rotary_inplace(positions, query, key, head_size, cos_sin_cache)
    return query, key
