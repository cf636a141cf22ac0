"""Chapter 20: the Triton fused MoE, checked on a CPU in Triton's interpreter (float32).

- align_by_expert equals a brute-force sort-and-pad, padding and unused blocks included.
- fused_moe equals the torch reference backend: top-1 and top-8, renormalised or not, experts
  that receive no token, one expert that fills several M-blocks, shapes that no block divides,
  an x that is a transposed view rather than contiguous.
- The backend registry: "auto" is torch on a CPU; `--moe triton` runs there only in the
  interpreter, and without it is refused with a message that says how to enable it.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.moe import (TorchMoEBackend, create_moe_backend, resolve_moe_backend,
                         select_experts)
from triton_helpers import fused_moe_kernels

CHAPTER = 20  # tools/steps.py check runs this module on chapter 20's own tree

CPU = torch.device("cpu")
# float32 on both sides, rounded at the same places; only the GEMMs' summation order differs
# (numpy's dot in the interpreter, BLOCK_K at a time, against MKL): at most 4e-7 here, a few
# float32 ulps of outputs up to 4. 1e-5 leaves a 25-fold margin, while a wrong expert, a lost
# slot or a weight applied twice moves outputs by 1e-2 or more.
TOL = dict(rtol=1e-5, atol=1e-5)


# On a GPU machine triton.language is imported compiled, and the interpreter cannot be switched
# on afterwards; tests/test_fused_moe_cuda.py checks the compiled kernels there.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the interpreter is the CPU's way to run the kernels")


@pytest.fixture(scope="module")
def kernels():
    """The kernel module built for the interpreter; TRITON_INTERPRET=1 while this module runs."""
    with fused_moe_kernels(interpret=True) as module:
        yield module


def layer(tokens: int, experts: int, hidden: int, inter: int, seed: int = 0):
    """Random x, router logits, w13, w2, scaled so that activations stay of order 1."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    logits = torch.randn(tokens, experts, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5
    return x, logits, w13, w2


def brute_force_align(ids: torch.Tensor, experts: int, block_m: int) -> tuple[list, list]:
    """Expert by expert, its pairs in order, padded with the sentinel to whole blocks."""
    flat = ids.flatten().tolist()
    rows, blocks = [], []
    for e in range(experts):
        mine = [p for p, chosen in enumerate(flat) if chosen == e]
        padded = mine + [len(flat)] * (-len(mine) % block_m)
        rows += padded
        blocks += [e] * (len(padded) // block_m)
    return rows, blocks


@pytest.mark.parametrize("tokens,experts,top_k,block_m,crowd", [
    (13, 8, 2, 4, None),   # random routing, some experts empty or exactly full
    (1, 16, 8, 16, None),  # one decode token: eight experts of one pair each
    (20, 8, 2, 16, 5),     # expert 5 in every token: 20 pairs, two M-blocks
    (7, 4, 1, 16, 0),      # all pairs on expert 0, the others empty
])
def test_align_equals_brute_force(kernels, tokens, experts, top_k, block_m, crowd):
    gen = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, experts, generator=gen)
    if crowd is not None:
        logits[:, crowd] += 100
    _, ids = select_experts(logits, top_k, renormalize=False)
    sorted_pairs, block_expert, padded_len = kernels.align_by_expert(ids, experts, block_m)
    rows, blocks = brute_force_align(ids, experts, block_m)
    sentinel = tokens * top_k
    assert sorted_pairs.numel() % block_m == 0 and sorted_pairs.numel() >= len(rows)
    assert sorted_pairs.numel() // block_m == block_expert.numel()
    assert sorted_pairs[:len(rows)].tolist() == rows
    assert (sorted_pairs[len(rows):] == sentinel).all()
    assert block_expert[:len(blocks)].tolist() == blocks
    assert (block_expert[len(blocks):] == -1).all()
    assert int(padded_len) == len(rows)


CASES = {  # name: tokens, experts, top_k, renormalize, hidden, inter, crowded expert
    "top1": (9, 8, 1, False, 64, 32, None),
    "top8-renormalized": (6, 16, 8, True, 64, 32, None),
    "top8-raw": (6, 16, 8, False, 64, 32, None),
    "empty-experts": (3, 16, 2, True, 64, 32, None),
    "crowded-expert-uneven-shapes": (40, 8, 2, False, 48, 40, 3),
}


@pytest.mark.parametrize("name", CASES)
def test_fused_equals_reference(kernels, name):
    tokens, experts, top_k, renormalize, hidden, inter, crowd = CASES[name]
    x, logits, w13, w2 = layer(tokens, experts, hidden, inter)
    if crowd is not None:
        logits[:, crowd] += 100
    weights, ids = select_experts(logits, top_k, renormalize)
    counts = torch.bincount(ids.flatten(), minlength=experts)
    block_m = kernels.default_config(tokens * top_k, experts).block_m
    if name == "empty-experts":
        assert (counts == 0).any()  # the case is about experts without tokens
    if crowd is not None:
        assert counts[crowd] > block_m  # ... and about an expert filling several M-blocks
    got = kernels.fused_moe(x, w13, w2, weights, ids)
    want = TorchMoEBackend().forward(x, logits, w13, w2, top_k, renormalize)
    torch.testing.assert_close(got, want, **TOL)


def test_non_contiguous_input(kernels):
    """x as a transposed view (dense, strides (1, tokens)): the kernels index rows as
    token * hidden, so the output must be laid out that way too, whatever x's strides were."""
    x, logits, w13, w2 = layer(9, 8, 64, 32)
    x = x.t().contiguous().t()
    assert not x.is_contiguous()
    weights, ids = select_experts(logits, 2, True)
    got = kernels.fused_moe(x, w13, w2, weights, ids)
    want = TorchMoEBackend().forward(x.contiguous(), logits, w13, w2, 2, True)
    torch.testing.assert_close(got, want, **TOL)


def test_no_tokens(kernels):
    x, logits, w13, w2 = layer(0, 8, 64, 32)
    weights, ids = select_experts(logits, 2, True)
    assert kernels.fused_moe(x, w13, w2, weights, ids).shape == (0, 64)


def test_backend_through_the_registry(kernels):
    assert resolve_moe_backend("triton", CPU, torch.float32) == "triton"
    x, logits, w13, w2 = layer(5, 8, 64, 32)
    got = create_moe_backend("triton").forward(x, logits, w13, w2, 2, True)
    want = create_moe_backend("torch").forward(x, logits, w13, w2, 2, True)
    torch.testing.assert_close(got, want, **TOL)


def test_auto_is_torch_on_cpu(kernels, monkeypatch):
    """The interpreter checks the kernel; it is no way to serve, so auto never picks it."""
    assert resolve_moe_backend("auto", CPU, torch.float32) == "torch"
    monkeypatch.delenv("TRITON_INTERPRET")
    assert resolve_moe_backend("auto", CPU, torch.float32) == "torch"


def test_triton_refused_on_cpu_without_interpreter(kernels, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="--moe triton cannot run here: .*TRITON_INTERPRET=1"):
        resolve_moe_backend("triton", CPU, torch.float32)
    # the variable set after the kernels were built for the GPU is too late
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kernels, "INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_moe_backend("triton", CPU, torch.float32)
