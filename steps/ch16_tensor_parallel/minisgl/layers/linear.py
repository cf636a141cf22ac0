"""Linear layers, sharded over the tensor-parallel ranks: a column-parallel layer (output
rows split, nothing communicated) feeding a row-parallel one (input columns split, one
all-reduce) costs one all-reduce per pair. With one rank every shard is the whole matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.distributed import get_comm, get_tp_info

from .base import BaseOP, meta_param


class Linear(BaseOP):
    """y = x @ weight.T (+ bias), weight stored [output_size, input_size] like the checkpoint.
    Every rank holds all of it (replicated)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.weight = meta_param(output_size, input_size)
        self.bias = meta_param(output_size) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input as one matmul (gate_proj + up_proj ->
    gate_up_proj), column-parallel: each rank holds its slice of every part, so its output is
    [its gate slice | its up slice] and the activation pairs them up locally."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        tp = get_tp_info()
        self.output_sizes = [tp.shard(size, "a projection's output size",
                                      "each rank computes an equal slice of it")
                             for size in output_sizes]
        super().__init__(input_size, sum(self.output_sizes), bias)


class QKVLinear(MergedLinear):
    """q, k and v projections fused, column-parallel by heads: each rank holds
    [its q heads | its k heads | its v heads]."""

    def __init__(self, hidden_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool = False) -> None:
        tp = get_tp_info()
        why = "each rank computes attention for whole heads of its own"
        q_heads = tp.shard(num_q_heads, "the number of query heads", why)
        kv_heads = tp.shard(num_kv_heads, "the number of KV heads", why)
        self.output_sizes = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        Linear.__init__(self, hidden_size, sum(self.output_sizes), bias)


class RowParallelLinear(Linear):
    """Input dimension split over the ranks; the partial products are summed (all-reduce).
    The bias is added once, after the sum."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        input_shard = get_tp_info().shard(input_size, "a row-parallel layer's input size",
                                          "each rank multiplies an equal slice of it")
        super().__init__(input_shard, output_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = get_comm().all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias
