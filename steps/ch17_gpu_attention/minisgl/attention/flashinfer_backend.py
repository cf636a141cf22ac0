"""Attention with FlashInfer's paged kernels: the pool is read where it lies, page by page."""

from __future__ import annotations

import importlib.util
from itertools import accumulate
from dataclasses import dataclass
from typing import Any

import torch

from minisgl.core import Batch
from minisgl.kvcache import MHAKVPool
from minisgl.utils import pin
from minisgl.utils.ragged import ragged_arange

from .base import BaseAttentionBackend

# Scratch memory of split-KV decode (partial outputs of a long request's chunks): FlashInfer's
# recommended size. Allocated once; every plan lays its work out inside it.
WORKSPACE_BYTES = 128 << 20
HEAD_DIMS = (64, 128, 256)  # the head sizes FlashInfer's kernels are built for


@dataclass
class FlashInferMetadata:
    last_indices: torch.Tensor  # [batch_size] on the device: each request's last row
    wrapper: Any  # the wrapper planned for this batch; run() by every layer
    # Host tensors plan() copies from asynchronously, and device tensors the kernels read:
    # the batch keeps them alive until its tokens are read.
    buffers: tuple[torch.Tensor, ...]


class FlashInferBackend(BaseAttentionBackend):
    """Decode with BatchDecodeWithPagedKVCacheWrapper, prefill (with or without a cached
    prefix) with BatchPrefillWithPagedKVCacheWrapper, both over the pool's pages.
    prepare_metadata plans each batch once, on the host; every layer's run() uses the plan.

    A plan overwrites its wrapper's schedule on the device, and with overlap batch i+1 is
    planned while batch i runs: two sets of wrappers take turns, and batch i-1, the other
    set's last user, has been read (is finished) by then.
    """

    prefill_kernels = "fa2"  # FlashInfer's own FlashAttention-2-style kernels

    def __init__(self, pool: MHAKVPool, page_table: torch.Tensor, num_qo_heads: int) -> None:
        import flashinfer

        self.pool, self.page_table = pool, page_table
        keys = pool.k_cache(0)  # [num_slots, kv_heads, head_dim]
        self.num_qo_heads, (self.num_kv_heads, self.head_dim) = num_qo_heads, keys.shape[1:]
        self.dtype, self.device, self.page_size = keys.dtype, keys.device, pool.page_size
        self.sm_scale = self.head_dim ** -0.5
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # Tensor cores pay off in decode once several query heads share a KV head.
        tensor_cores = num_qo_heads // self.num_kv_heads >= 4
        self.wrapper_sets = [
            (flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                workspace, "NHD", backend=self.prefill_kernels),
             flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=tensor_cores))
            for _ in range(2)]
        self.batches_planned = 0

    @classmethod
    def create(cls, pool: MHAKVPool, page_table: torch.Tensor,
               num_qo_heads: int) -> BaseAttentionBackend:
        return cls(pool, page_table, num_qo_heads)

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype,
                           head_dim: int) -> str | None:
        if device.type != "cuda":
            return f"FlashInfer's kernels run on CUDA GPUs, and the device is {device}"
        if dtype not in (torch.float16, torch.bfloat16):
            return (f"FlashInfer computes in float16 or bfloat16, and the model runs in {dtype}; "
                    "use --dtype bfloat16")
        if head_dim not in HEAD_DIMS:
            return f"FlashInfer supports head_dim {HEAD_DIMS}, and the model's is {head_dim}"
        if importlib.util.find_spec("flashinfer") is None:
            return "the package flashinfer-python is not installed: pip install -e '.[gpu]'"
        return None

    def prepare_metadata(self, batch: Batch) -> None:
        reqs, size, n = batch.reqs, self.page_size, len(batch.reqs)
        # The batch's shape, as FlashInfer's plan wants it: host tensors, pinned so that the
        # copies plan() makes are asynchronous. Built from a few Python ints per request: the
        # host's work grows with the number of requests, never with their lengths.
        seq = [r.device_len for r in reqs]
        pages = [(s + size - 1) // size for s in seq]
        shape = [0, *accumulate(r.extend_len for r in reqs), 0, *accumulate(pages),
                 *(s - (p - 1) * size for s, p in zip(seq, pages)), *seq,
                 *(r.table_idx for r in reqs)]
        host = pin(torch.tensor(shape, dtype=torch.int32), self.device)
        qo_indptr, kv_indptr, last_page_len, seq_lens, _ = host.split([n + 1, n + 1, n, n, n])
        # The page indices are one per page of context (256 requests of 1,000 tokens at
        # page_size 1: 256,000), so they are computed where the page table is: the pages of
        # request r are page_table[row_r, j * page_size] // page_size for j < pages[r].
        device = host.to(self.device, non_blocking=True)
        qo_indptr_d, kv_indptr_d, _, _, rows = device.split([n + 1, n + 1, n, n, n])
        owner, page_of_req = ragged_arange(torch.zeros_like(rows), kv_indptr_d.diff(),
                                           total=sum(pages))
        flat = rows.long()[owner] * self.page_table.shape[1] + page_of_req * size
        indices = self.page_table.view(-1)[flat] // size
        last_indices = qo_indptr_d[1:].long() - 1  # each request's last query row

        prefill, decode = self.wrapper_sets[self.batches_planned % 2]
        self.batches_planned += 1
        common = dict(num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads,
                      page_size=size, sm_scale=self.sm_scale, q_data_type=self.dtype,
                      kv_data_type=self.dtype, non_blocking=True, seq_lens=seq_lens)
        if batch.is_decode:
            decode.plan(kv_indptr, indices, last_page_len, head_dim=self.head_dim, **common)
            wrapper = decode
        else:
            # causal: the query rows of a request are its last extend_len positions, so row i
            # sees keys up to cached_len + i (FlashInfer aligns the mask to the end of the keys).
            prefill.plan(qo_indptr, kv_indptr, indices, last_page_len, head_dim_qk=self.head_dim,
                         causal=True, **common)
            wrapper = prefill
        batch.attn_metadata = FlashInferMetadata(
            last_indices=last_indices, wrapper=wrapper, buffers=(host, device, indices))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        meta: FlashInferMetadata = batch.attn_metadata  # type: ignore[assignment]
        self.pool.store_kv(k, v, batch.out_loc, layer_id)
        pages = (-1, self.page_size, self.num_kv_heads, self.head_dim)  # NHD, page by page
        kv = (self.pool.k_cache(layer_id).view(pages), self.pool.v_cache(layer_id).view(pages))
        return meta.wrapper.run(q, kv)
