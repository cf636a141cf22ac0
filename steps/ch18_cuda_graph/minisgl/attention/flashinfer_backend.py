"""Attention with FlashInfer's paged kernels: the pool is read where it lies, page by page."""

from __future__ import annotations

import importlib.util
from itertools import accumulate
from dataclasses import dataclass
from typing import Any

import torch

from minisgl.core import Batch
from minisgl.kvcache import MHAKVPool
from minisgl.utils import create_event, pin
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
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # Tensor cores pay off in decode once several query heads share a KV head.
        self.tensor_cores = num_qo_heads // self.num_kv_heads >= 4
        self.wrapper_sets = [
            (flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", backend=self.prefill_kernels),
             flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=self.tensor_cores))
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

    def _host_shape(self, seq_lens: list[int], extend_lens: list[int],
                    rows: list[int]) -> tuple[torch.Tensor, list[torch.Tensor], int]:
        """The batch's shape as plan() wants it, in one pinned host tensor (plan's copies are
        then asynchronous): qo_indptr, kv_indptr, last_page_len, seq_lens, then `rows`; and the
        number of pages. Built from a few Python ints per request: the host's work grows with
        the number of requests, never with their lengths."""
        size, n = self.page_size, len(seq_lens)
        pages = [(s + size - 1) // size for s in seq_lens]
        shape = [0, *accumulate(extend_lens), 0, *accumulate(pages),
                 *(s - (p - 1) * size for s, p in zip(seq_lens, pages)), *seq_lens, *rows]
        host = pin(torch.tensor(shape, dtype=torch.int32), self.device)
        return host, host.split([n + 1, n + 1, n, n, len(rows)]), sum(pages)

    def _shape(self, rows: list[int], seq_lens: list[int],
               extend_lens: list[int]) -> tuple[torch.Tensor, ...]:
        """The host shape, plus, on the device, the page indices and each request's last query
        row."""
        size, n = self.page_size, len(rows)
        host, (qo_indptr, kv_indptr, last_page_len, seq, _), total = self._host_shape(
            seq_lens, extend_lens, rows)
        # The page indices are one per page of context (256 requests of 1,000 tokens at
        # page_size 1: 256,000), so they are computed where the page table is: the pages of
        # request r are page_table[row_r, j * page_size] // page_size for j < pages[r].
        device = host.to(self.device, non_blocking=True)
        qo_indptr_d, kv_indptr_d, _, _, rows_d = device.split([n + 1, n + 1, n, n, n])
        owner, page_of_req = ragged_arange(torch.zeros_like(rows_d), kv_indptr_d.diff(),
                                           total=total)
        flat = rows_d.long()[owner] * self.page_table.shape[1] + page_of_req * size
        indices = self.page_table.view(-1)[flat] // size
        last_indices = qo_indptr_d[1:].long() - 1
        return qo_indptr, kv_indptr, indices, last_page_len, seq, last_indices, host, device

    def _plan_decode(self, wrapper: Any, kv_indptr: torch.Tensor, indices: torch.Tensor,
                     last_page_len: torch.Tensor, seq_lens: torch.Tensor) -> None:
        wrapper.plan(kv_indptr, indices, last_page_len, num_qo_heads=self.num_qo_heads,
                     num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                     page_size=self.page_size, sm_scale=self.sm_scale, q_data_type=self.dtype,
                     kv_data_type=self.dtype, non_blocking=True, seq_lens=seq_lens)

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.reqs
        qo_indptr, kv_indptr, indices, last_page_len, seq_lens, last_indices, host, device = \
            self._shape([r.table_idx for r in reqs], [r.device_len for r in reqs],
                        [r.extend_len for r in reqs])
        prefill, decode = self.wrapper_sets[self.batches_planned % 2]
        self.batches_planned += 1
        if batch.is_decode:
            self._plan_decode(decode, kv_indptr, indices, last_page_len, seq_lens)
            wrapper = decode
        else:
            # causal: the query rows of a request are its last extend_len positions, so row i
            # sees keys up to cached_len + i (FlashInfer aligns the mask to the end of the keys).
            prefill.plan(qo_indptr, kv_indptr, indices, last_page_len,
                         num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads,
                         head_dim_qk=self.head_dim, page_size=self.page_size, causal=True,
                         sm_scale=self.sm_scale, q_data_type=self.dtype,
                         kv_data_type=self.dtype, non_blocking=True, seq_lens=seq_lens)
            wrapper = prefill
        batch.attn_metadata = FlashInferMetadata(
            last_indices=last_indices, wrapper=wrapper,
            buffers=(host, device, indices))

    # --- CUDA graphs: FlashInfer's graph decode wrapper reads its shape from static buffers ---

    def init_graph(self, max_batch_size: int, dummy_row: int) -> None:
        self.pages_per_row = self.page_table.shape[1] // self.page_size
        self.graph_indptr = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=self.device)
        self.graph_indices = torch.zeros(max_batch_size * self.pages_per_row, dtype=torch.int32,
                                         device=self.device)
        # 0, 1, 2, ...: the position of each entry of graph_indices (see prepare_in_graph).
        self.graph_index_positions = torch.arange(len(self.graph_indices), device=self.device)
        self.graph_last_page_len = torch.ones(max_batch_size, dtype=torch.int32,
                                              device=self.device)
        self.graph_wrappers: dict[int, Any] = {}
        # Split-KV scratch of their own: the eager wrappers' work must never share it.
        self.graph_workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # A plan copies from a pinned host buffer without waiting: the next plan must not
        # overwrite it before that copy ran (long ago in practice, but waited for).
        self.last_plan = create_event(self.device)
        self.last_plan.record()

    def capture_metadata(self, batch_size: int) -> FlashInferMetadata:
        import flashinfer

        wrapper = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, self.graph_indptr[: batch_size + 1], self.graph_indices,
            self.graph_last_page_len[:batch_size], "NHD", use_tensor_cores=self.tensor_cores)
        self.graph_wrappers[batch_size] = wrapper
        self._plan_replay(wrapper, [1] * batch_size)  # plan, then capture
        return FlashInferMetadata(torch.arange(batch_size, device=self.device), wrapper, ())

    def prepare_replay(self, batch: Batch, padded_size: int) -> None:
        pad = padded_size - batch.size  # padding rows: the dummy row, one key
        self.last_plan.synchronize()
        self._plan_replay(self.graph_wrappers[padded_size],
                          [r.device_len for r in batch.reqs] + [1] * pad)
        self.last_plan.record()

    def _plan_replay(self, wrapper: Any, seq_lens: list[int]) -> None:
        """Plan a replay from its sequence lengths alone. The page indices handed to plan()
        are the static buffer itself, which the replay writes (prepare_in_graph)."""
        _, (_, kv_indptr, last_page_len, seq, _), total = self._host_shape(
            seq_lens, [1] * len(seq_lens), [])
        self._plan_decode(wrapper, kv_indptr, self.graph_indices[:total], last_page_len, seq)

    def prepare_in_graph(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """Recorded into every captured decode step, before the layers: the batch's page
        indices, from the static rows and positions. Entry j belongs to the request whose pages
        end first after j; entries past the last page are filled too and never read."""
        size, per_row, n = self.page_size, self.pages_per_row, len(rows)
        pages = positions // size + 1
        ends = pages.cumsum(0)
        j = self.graph_index_positions[: n * per_row]
        owner = torch.searchsorted(ends, j, right=True).clamp_(max=n - 1)
        page = (j - ends[owner] + pages[owner]).clamp_(max=per_row - 1)
        self.graph_indices[: len(j)] = self.page_table[rows[owner], page * size] // size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        meta: FlashInferMetadata = batch.attn_metadata  # type: ignore[assignment]
        self.pool.store_kv(k, v, batch.out_loc, layer_id)
        pages = (-1, self.page_size, self.num_kv_heads, self.head_dim)  # NHD, page by page
        kv = (self.pool.k_cache(layer_id).view(pages), self.pool.v_cache(layer_id).view(pages))
        return meta.wrapper.run(q, kv)
