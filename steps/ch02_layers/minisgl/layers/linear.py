from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import BaseOP, meta_param


class Linear(BaseOP):
    """y = x @ weight.T (+ bias), weight stored [output_size, input_size] like the checkpoint."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.weight = meta_param(output_size, input_size)
        self.bias = meta_param(output_size) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input as one matmul; the checkpoint's separate weights are
    concatenated along the output dimension while loading (gate_proj + up_proj -> gate_up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = output_sizes


class QKVLinear(MergedLinear):
    """q, k and v projections fused: output = [q heads | k heads | v heads]."""

    def __init__(self, hidden_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool = False) -> None:
        sizes = [num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        super().__init__(hidden_size, sizes, bias)
