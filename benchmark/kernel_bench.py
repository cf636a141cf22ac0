"""Our CUDA kernels (chapter 19) against the ops they replace, on a GPU, in one run.

    python benchmark/kernel_bench.py --tokens 1 256 16384

Shapes are Qwen3-0.6B's in bfloat16: 8 KV heads and 16 query heads of 128, embedding rows of
1024 over a 151,936-token vocabulary (sliced in two, as rank 1 of TP=2 holds it). Each op runs
--iters times, captured in one CUDA graph (as a decode step runs them) and replayed between two
CUDA events, best of --rounds; the bandwidth counts the bytes each kernel must read and write at
least once (the gather reads only the rows of ids inside the rank's slice). The row `copy`
times a plain device-to-device copy of as many bytes as the KV store moves (read + written,
timed the same way): the rate the kernels' GB/s are measured against, taken on the same GPU.
A call whose data fits in the L2 cache (taken as L2_BYTES) would find it there on its next run,
so the graph cycles through independent input sets: sets are added until one cycle through
them holds 4 x L2 of the smallest kernel's data, at most 64 sets (small calls are bound by
latency, not bandwidth). At 16,384 tokens that is 5 sets; at 256 tokens the cap leaves one
cycle of the gather near 1 x L2, and at 1 token all sets fit in the L2.
The last columns time our wrappers called eagerly: the host's cost per call (Python, ctypes,
the launch), which a graph removes from decode but prefill still pays.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch

from minisgl.benchmark.perf import best_microseconds
from minisgl.kernel import apply_rotary_inplace, cuda_kernels, rms_norm

DTYPE = torch.bfloat16
KV_HEADS, Q_HEADS, HEAD_DIM, HIDDEN, VOCAB = 8, 16, 128, 1024, 151936
L2_BYTES = 50 * 2**20


def cases(tokens: int) -> list[tuple[str, Callable[[], object], Callable[[], object] | None,
                                     int]]:
    """(name, ours, the op it replaces, bytes moved) for `tokens` tokens; the reference row
    `copy` replaces nothing."""
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda", dtype=DTYPE)
    q = qkv[:, :Q_HEADS * HEAD_DIM]
    k = qkv[:, Q_HEADS * HEAD_DIM:(Q_HEADS + KV_HEADS) * HEAD_DIM]
    v = qkv[:, (Q_HEADS + KV_HEADS) * HEAD_DIM:]
    k3, v3 = k.view(tokens, KV_HEADS, HEAD_DIM), v.view(tokens, KV_HEADS, HEAD_DIM)
    slots = max(4 * tokens, 65536)
    k_cache, v_cache = (torch.empty(slots, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
                        for _ in range(2))
    out_loc = torch.randperm(slots, device="cuda")[:tokens]

    def torch_store() -> None:
        k_cache[out_loc] = k3
        v_cache[out_loc] = v3

    half = VOCAB // 2
    weights = torch.randn(half, HIDDEN, device="cuda", dtype=DTYPE)
    ids = torch.randint(0, VOCAB, (tokens,), device="cuda")

    def torch_gather() -> torch.Tensor:
        local = ids - half
        inside = (local >= 0) & (local < half)
        return weights[local.clamp(0, half - 1)] * inside[:, None].to(DTYPE)

    q_weight, k_weight = (torch.rand(HEAD_DIM, device="cuda", dtype=DTYPE) + 0.5
                          for _ in range(2))
    angles = torch.outer(torch.arange(4096, device="cuda", dtype=torch.float),
                         1.0 / 1e6 ** (torch.arange(0, HEAD_DIM, 2, device="cuda") / HEAD_DIM))
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, 4096, (tokens,), device="cuda")

    def replaced_norm_rope() -> None:  # the GPU path before this chapter: FlashInfer's kernels
        qn = rms_norm(q.view(tokens, Q_HEADS, HEAD_DIM), q_weight, 1e-6).flatten(1)
        kn = rms_norm(k.view(tokens, KV_HEADS, HEAD_DIM), k_weight, 1e-6).flatten(1)
        apply_rotary_inplace(positions, qn, kn, HEAD_DIM, cache)

    row = KV_HEADS * HEAD_DIM * DTYPE.itemsize
    heads = (Q_HEADS + KV_HEADS) * HEAD_DIM * DTYPE.itemsize
    src = torch.empty(2 * tokens * row, device="cuda", dtype=torch.uint8)  # K and V's bytes
    dst = torch.empty_like(src)
    return [
        ("store_kv", lambda: cuda_kernels.store_kv(k_cache, v_cache, out_loc, k3, v3),
         torch_store, 2 * 2 * tokens * row),
        ("masked_gather", lambda: cuda_kernels.masked_gather(weights, ids, (half, half)),
         torch_gather, (tokens + int((ids >= half).sum())) * HIDDEN * DTYPE.itemsize),
        ("qk_norm_rope", lambda: cuda_kernels.qk_norm_rope(
            positions, q, k, HEAD_DIM, q_weight, k_weight, 1e-6, cache),
         replaced_norm_rope, 2 * tokens * heads),
        ("copy", lambda: dst.copy_(src), None, 2 * src.numel()),
    ]


def weight_copies(n_out: int, k: int, copies: int | None = None) -> list[torch.Tensor]:
    """Random bfloat16 weights [n_out, k]; by default as many copies as make 4 x the L2 (at
    most 48): a graph that takes them in turn reads each from memory, as 28 layers' weights are
    read. One copy stays in the L2 after its first use."""
    if copies is None:
        copies = max(1, min(48, -(-4 * L2_BYTES // (n_out * k * 2))))
    return [torch.randn(n_out, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            for _ in range(copies)]


def cycling(ops: list[Callable[[], object]]) -> Callable[[], object]:
    """One op per call, taking the sets in turn: a graph of many calls records them in turn."""
    turn = itertools.cycle(ops)
    return lambda: next(turn)()


def number(microseconds: float | None) -> str:
    return "-" if microseconds is None else f"{microseconds:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 256, 16384])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cuda_kernels.set_mode("auto")
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · bfloat16 · "
          f"best of {args.rounds} × {args.iters} calls in a CUDA graph")
    print(f"{'kernel':<14} {'tokens':>7} {'ours µs':>9} {'replaced µs':>12} {'speed-up':>9} "
          f"{'ours GB/s':>10} {'eager µs: ours':>15} {'replaced':>9}")
    for tokens in args.tokens:
        sets = [cases(tokens)]  # until a cycle holds 4 x L2 of the smallest data, <= 64 sets
        while min(c[3] for c in sets[0]) * len(sets) < 4 * L2_BYTES and len(sets) < 64:
            sets.append(cases(tokens))
        for kernel in zip(*sets):
            name, nbytes = kernel[0][0], sum(c[3] for c in kernel) / len(kernel)
            ours = cycling([c[1] for c in kernel])
            replaced = None if kernel[0][2] is None else cycling([c[2] for c in kernel])
            mine = best_microseconds(ours, args.iters, args.rounds)
            theirs = None if replaced is None else best_microseconds(replaced, args.iters,
                                                                     args.rounds)
            eager = [None if op is None else best_microseconds(op, args.iters, args.rounds,
                                                               graph=False)
                     for op in (ours, replaced)]
            speed_up = "-" if theirs is None else f"{theirs / mine:.2f}x"
            print(f"{name:<14} {tokens:>7} {mine:>9.2f} {number(theirs):>12} {speed_up:>9} "
                  f"{nbytes / mine / 1e3:>10.1f} {number(eager[0]):>15} {number(eager[1]):>9}")


if __name__ == "__main__":
    main()
