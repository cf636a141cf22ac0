"""Chapter 20 on a GPU (skipped without CUDA): the compiled Triton fused MoE against the torch
reference in bfloat16, on the layer shape of Qwen3-30B-A3B (128 experts, top-8, hidden 2048,
moe_intermediate_size 768), at decode and prefill batch sizes; the same launch captured in a
CUDA graph; "auto" picks it."""

from __future__ import annotations

import pytest
import torch

from minisgl.moe import TorchMoEBackend, resolve_moe_backend, select_experts
from triton_helpers import fused_moe_kernels

CHAPTER = 20

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768


@pytest.fixture(scope="module")
def kernels():
    """The kernel module compiled for the GPU, even if the CPU tests built it interpreted."""
    with fused_moe_kernels(interpret=False) as module:
        yield module


@pytest.fixture(scope="module")
def weights():
    """Random experts scaled so that every activation is of order 1 (about 1.2 GB in bf16)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN ** 0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=gen) / INTER ** 0.5
    return w13.bfloat16(), w2.bfloat16()


def inputs(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen)
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=gen)
    return x.bfloat16(), logits.bfloat16()


@pytest.mark.parametrize("tokens", [1, 64, 256, 4096])
def test_fused_matches_reference_bf16(kernels, weights, tokens):
    """Both round at the same places (h, h x weight, each partial sum over the experts, in
    ascending expert order); they can differ only where a GEMM's float32 sum, if tl.dot and
    cuBLAS take it in another order (neither promises one), lands on the other side of a bfloat16
    rounding boundary, and that one-step difference propagates. So: within 4 bfloat16 steps of
    the largest output (2**-5 of it), and at most twice the reference's error against the
    float32 truth. Bit-identity is reported, not required."""
    w13, w2 = weights
    x, logits = inputs(tokens, seed=tokens)
    topk_weights, topk_ids = select_experts(logits, TOP_K, renormalize=True)
    got = kernels.fused_moe(x, w13, w2, topk_weights, topk_ids)
    want = TorchMoEBackend().forward(x, logits, w13, w2, TOP_K, True)
    exact = TorchMoEBackend().forward(x.float(), logits.float(), w13.float(), w2.float(),
                                      TOP_K, True)
    scale = float(exact.abs().max())
    diff = (got.float() - want.float()).abs()
    err_fused = float((got.float() - exact).abs().max())
    err_ref = float((want.float() - exact).abs().max())
    print(f"\ntokens {tokens}: bit-identical {float((diff == 0).float().mean()):.4f}, "
          f"max |fused - ref| {float(diff.max()):.2e}, max error vs float32: fused "
          f"{err_fused:.2e}, ref {err_ref:.2e}, largest output {scale:.2f}")
    assert float(diff.max()) <= 2 ** -5 * scale
    assert err_fused <= 2 * err_ref


def test_replays_in_a_cuda_graph(kernels, weights):
    """No host sync and shapes fixed by the batch size: the whole call captures, and a replay on
    new inputs equals the eager call on them (the kernels are deterministic: no atomics)."""
    w13, w2 = weights
    x, logits = inputs(64, seed=1)
    topk_weights, topk_ids = select_experts(logits, TOP_K, renormalize=True)
    kernels.fused_moe(x, w13, w2, topk_weights, topk_ids)  # compile before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.fused_moe(x, w13, w2, topk_weights, topk_ids)
    new_x, new_logits = inputs(64, seed=2)
    new_weights, new_ids = select_experts(new_logits, TOP_K, renormalize=True)
    x.copy_(new_x)
    topk_weights.copy_(new_weights)
    topk_ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, kernels.fused_moe(new_x, w13, w2, new_weights, new_ids))


def test_auto_is_triton_on_gpu(kernels):
    assert resolve_moe_backend("auto", torch.device("cuda"), torch.bfloat16) == "triton"
