"""The fused MoE in Triton: all experts in one grouped-GEMM launch per projection, over the
(token, slot) pairs sorted by expert. Triton chooses between the GPU and its CPU interpreter
(TRITON_INTERPRET=1) at `@triton.jit` time: this module is imported only when the Triton
backend is created, and INTERPRETED records the choice."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def default_config(num_pairs: int, num_experts: int) -> GemmConfig:
    """Tile sizes by the average rows an expert receives: decode gives it a row or two, so a
    64-row tile would be mostly padding and tl.dot's smallest M (16) is taken."""
    if num_pairs <= 16 * num_experts:
        return GemmConfig(block_m=16, block_n=64, block_k=64)
    return GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=8)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int,
                    block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the pairs p = token * top_k + slot by expert and pad each expert's segment to a
    multiple of block_m. Returns
      sorted_pairs  int32 [max_len]: pair ids, expert by expert (pair order within an expert),
                    padding rows hold the sentinel topk_ids.numel();
      block_expert  int32 [max_len // block_m]: the expert of each M-block, -1 past the end;
      padded_len    int64 0-d tensor: the padded length in use.
    max_len is the worst case (every non-empty expert wastes block_m - 1 rows), so the grid
    size depends on the shapes only: no device-to-host copy, and a CUDA graph can hold it."""
    flat = topk_ids.flatten().long()  # scatter_add_ indexes with int64
    num_pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync to size its output
    padded = (counts + block_m - 1) // block_m * block_m
    segment_end = padded.cumsum(0)
    segment_start = segment_end - padded

    order = torch.argsort(flat, stable=True)  # pair ids grouped by expert
    expert_of = flat[order]
    # the rank of a pair inside its expert's group: its sorted position minus the group's first
    group_start = counts.cumsum(0) - counts
    rank = torch.arange(num_pairs, device=device) - group_start[expert_of]

    max_len = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    max_len = triton.cdiv(max_len, block_m) * block_m
    sorted_pairs = torch.full((max_len,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs[segment_start[expert_of] + rank] = order.to(torch.int32)

    # block b starts at row b * block_m, inside the first segment that ends after it
    block_start = torch.arange(0, max_len, block_m, device=device)
    block_expert = torch.searchsorted(segment_end, block_start, right=True)
    block_expert = torch.where(block_start < segment_end[-1], block_expert, -1)
    return sorted_pairs, block_expert.to(torch.int32), segment_end[-1]


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, weights_ptr, sorted_pairs_ptr, block_expert_ptr,
                         N, K, num_pairs, stride_am, stride_be, stride_bn, stride_cm,
                         PAIRS_PER_A_ROW: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[p, n-tile] = A[p // PAIRS_PER_A_ROW] @ B[expert, n-tile, :]^T for the BLOCK_M pairs p
    of M-block program_id(0); with MUL_WEIGHT, times the pair's routing weight. Inner strides
    are 1 (the wrapper checks)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # a block past the last expert's padded segment
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + offs_m).to(tl.int64)  # int64: row * stride can pass 2**31
    row_mask = pairs < num_pairs  # padding rows hold the sentinel num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    # GEMM 1 reads token rows of x (top_k pairs per token); GEMM 2 reads pair rows.
    a_ptrs = a_ptr + (pairs // PAIRS_PER_A_ROW)[:, None] * stride_am + offs_k[None, :]
    # a [BLOCK_K, BLOCK_N] view of B[expert] transposed: w is stored [N, K] like nn.Linear's
    b_ptrs = (b_ptr + expert.to(tl.int64) * stride_be
              + offs_n[None, :] * stride_bn + offs_k[:, None])

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # float32 accumulation, like cuBLAS
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += tl.dot(a, b, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    # Round where the reference rounds: its F.linear returns h in the model dtype, which it
    # multiplies by the routing weight cast to that dtype. The product of two bf16 (or fp16)
    # numbers is exact in float32, so rounding it once gives torch's h * w bit for bit.
    c = acc.to(c_ptr.dtype.element_ty)
    if MUL_WEIGHT:
        w = tl.load(weights_ptr + pairs, mask=row_mask, other=0.0).to(c_ptr.dtype.element_ty)
        c = (c.to(tl.float32) * w.to(tl.float32)[:, None]).to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + pairs[:, None] * stride_cm + offs_n[None, :], c,
             mask=row_mask[:, None] & n_mask[None, :])


@triton.jit
def _sum_slots_kernel(c_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = c[t, 0] + c[t, 1] + ... + c[t, TOP_K - 1], left to right, rounding each partial
    sum to the output dtype: the reference's index_add_ of one expert after another."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    row = c_ptr + token * TOP_K * H
    acc = tl.load(row + offs, mask=mask, other=0.0)
    for j in range(1, TOP_K):
        x = tl.load(row + j * H + offs, mask=mask, other=0.0)
        acc = (acc.to(tl.float32) + x.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + token * H + offs, acc, mask=mask)


# How the kernels were built: JITFunction compiles for a GPU; the interpreter's stand-in
# (InterpretedFunction, not a JITFunction subclass) runs them on CPU tensors with numpy.
INTERPRETED = not isinstance(_grouped_gemm_kernel, triton.runtime.JITFunction)


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, weights: torch.Tensor,
                 sorted_pairs: torch.Tensor, block_expert: torch.Tensor, pairs_per_a_row: int,
                 mul_weight: bool, config: GemmConfig) -> None:
    """out[p] = a[p // pairs_per_a_row] @ b[expert(p)]^T (x weights[p]) for every pair p that
    sorted_pairs lists; a [rows, K], b [experts, N, K], out [pairs, N], weights [pairs]."""
    assert a.stride(-1) == 1 and b.is_contiguous() and out.is_contiguous(), "inner stride 1"
    assert a.dtype == b.dtype == out.dtype, (a.dtype, b.dtype, out.dtype)
    n, k = b.shape[1], b.shape[2]
    grid = (block_expert.numel(), triton.cdiv(n, config.block_n))
    _grouped_gemm_kernel[grid](
        a, b, out, weights, sorted_pairs, block_expert, n, k, out.shape[0],
        a.stride(0), b.stride(0), b.stride(1), out.stride(0),
        PAIRS_PER_A_ROW=pairs_per_a_row, MUL_WEIGHT=mul_weight,
        # float32 inputs would otherwise go through TF32 tensor cores (10-bit mantissa), far
        # from the float32 reference; for 16-bit inputs the option does not apply
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, config: GemmConfig | None = None) -> torch.Tensor:
    """x [T, hidden] through its top_k experts: w13 [E, 2 * inter, hidden] (gate rows, then
    up rows), w2 [E, hidden, inter], topk_weights [T, top_k] float32, topk_ids [T, top_k].
    Rounds where the torch reference does, so the two differ only by GEMM summation order."""
    tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    assert w13.shape[2] == hidden and w2.shape == (num_experts, hidden, two_inter // 2), (
        x.shape, w13.shape, w2.shape)
    assert topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == tokens
    top_k = topk_ids.shape[1]
    x = x.contiguous()  # the kernels address rows as token * hidden, in x and in out alike
    out = torch.empty_like(x)  # after .contiguous(): empty_like keeps a dense view's strides
    if tokens == 0:
        return out
    # The reference adds the experts' outputs in ascending expert order; sorting each token's
    # slots the same way lets _sum_slots_kernel add in that order too.
    topk_ids, order = topk_ids.sort(dim=1)
    topk_weights = topk_weights.gather(1, order).contiguous()
    num_pairs = tokens * top_k
    config = config or default_config(num_pairs, num_experts)
    sorted_pairs, block_expert, _ = align_by_expert(topk_ids, num_experts, config.block_m)

    gate_up = torch.empty(num_pairs, two_inter, dtype=x.dtype, device=x.device)
    grouped_gemm(x, w13, gate_up, topk_weights, sorted_pairs, block_expert,
                 pairs_per_a_row=top_k, mul_weight=False, config=config)
    # The reference's own expression, so the intermediate rounds identically.
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) * up
    down = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    grouped_gemm(act, w2, down, topk_weights, sorted_pairs, block_expert,
                 pairs_per_a_row=1, mul_weight=True, config=config)

    block_h = min(1024, triton.next_power_of_2(hidden))
    _sum_slots_kernel[(tokens, triton.cdiv(hidden, block_h))](down, out, hidden, TOP_K=top_k,
                                                               BLOCK_H=block_h)
    return out
