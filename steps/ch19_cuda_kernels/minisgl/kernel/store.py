from __future__ import annotations

import torch

from . import cuda_kernels


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Write each new token's K and V into its slot: k_cache[indices[i]] = k[i].

    k_cache / v_cache: [num_slots, num_kv_heads, head_dim], one layer of the pool seen token by
    token; indices: [num_tokens] slot numbers (batch.out_loc); k / v: [num_tokens, heads, dim].
    """
    if cuda_kernels.target_for(k) and cuda_kernels.store_kv(k_cache, v_cache, indices, k, v):
        return  # chapter 19: one launch for both, instead of two index_put kernels
    k_cache[indices] = k
    v_cache[indices] = v
