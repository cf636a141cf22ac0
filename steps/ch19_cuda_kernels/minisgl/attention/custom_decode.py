"""Captured decode steps attended by chapter 19's kernel (csrc/decode_attention.cu), every other
batch by the attention backend it stands in front of."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.core import Batch
from minisgl.kernel import cuda_kernels
from minisgl.kvcache import MHAKVPool

from .base import BaseAttentionBackend


@dataclass
class CustomDecodeMetadata:
    """A captured decode step: no host plan, no page indices; the kernel reads the page table
    rows and the plan the step makes on the device (prepare_in_graph)."""

    last_indices: torch.Tensor


class CustomDecodeAttention(BaseAttentionBackend):
    """`backend` for every batch except the captured decode steps, which run our kernel: one
    launch a layer stores the new token's K/V and attends, with chunks planned on the device to
    fill a wave of blocks. Its sums run in another order than FlashInfer's: bfloat16 greedy
    tokens may differ at near ties. The engine puts it in front of the backend once, at graph
    capture, where the kernel takes the model (`takes`)."""

    def __init__(self, backend: BaseAttentionBackend, pool: MHAKVPool, page_table: torch.Tensor,
                 num_qo_heads: int) -> None:
        self.backend, self.pool, self.page_table = backend, pool, page_table
        keys = pool.k_cache(0)  # [num_slots, kv_heads, head_dim]
        self.num_qo_heads, (self.num_kv_heads, self.head_dim) = num_qo_heads, keys.shape[1:]
        self.dtype, self.device = keys.dtype, keys.device
        self.sm_scale = self.head_dim ** -0.5
        self.rows: torch.Tensor | None = None  # set by prepare_in_graph

    @staticmethod
    def takes(pool: MHAKVPool, num_qo_heads: int) -> bool:
        """Whether our kernels run for this pool's tensors and one of the kernel's builds
        fits its dtype, head size and query heads per KV head."""
        keys = pool.k_cache(0)
        return (cuda_kernels.target_for(keys) is not None
                and keys.dtype in (torch.float32, torch.bfloat16)
                and keys.shape[2] in cuda_kernels.DECODE_ATTENTION_HEAD_DIMS
                and num_qo_heads // keys.shape[1] <= cuda_kernels.DECODE_ATTENTION_MAX_GROUP)

    def prepare_metadata(self, batch: Batch) -> None:
        self.backend.prepare_metadata(batch)

    def init_graph(self, max_batch_size: int, dummy_row: int) -> None:
        # The kernel cuts the step's contexts into chunks, a block of 128 threads per chunk
        # and KV head, as many as the SMs hold at once (a wave), or two waves where the
        # contexts differ a lot (the plan, decode_attention.cu).
        self.items_per_wave = cuda_kernels.decode_attention_items_per_wave(
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.dtype, self.device)
        self.scratch = cuda_kernels.decode_attention_scratch(
            max_batch_size, self.items_per_wave, self.num_qo_heads, self.num_kv_heads,
            self.head_dim, self.device)

    def capture_metadata(self, batch_size: int) -> CustomDecodeMetadata:
        return CustomDecodeMetadata(torch.arange(batch_size, device=self.device))

    def prepare_replay(self, batch: Batch, padded_size: int) -> None:
        """Nothing on the host: the graph plans from its static positions itself."""

    def prepare_in_graph(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """The step's plan, from the static positions, by one small kernel for all the layers.
        It may read them before the kernels before it finish (PDL): the runner copies them in
        before each replay, outside the graph."""
        self.rows = rows
        if not cuda_kernels.decode_attention_plan(positions, self.items_per_wave, self.scratch):
            raise RuntimeError("decode_attention_plan declined the positions of a step")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        if not isinstance(batch.attn_metadata, CustomDecodeMetadata):
            return self.backend.forward(q, k, v, layer_id, batch)
        out = cuda_kernels.decode_attention(
            q, k, v, self.pool.k_cache(layer_id), self.pool.v_cache(layer_id), self.page_table,
            self.rows, batch.positions, batch.out_loc, self.sm_scale,  # type: ignore[arg-type]
            self.items_per_wave, self.scratch)
        if out is None:
            raise RuntimeError("decode_attention declined the tensors of a captured step")
        return out
