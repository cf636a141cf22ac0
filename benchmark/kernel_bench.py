"""Our CUDA kernels (chapter 19) against the ops they replace, on a GPU, in one run.

    python benchmark/kernel_bench.py --tokens 1 256 16384

Shapes are Qwen3-0.6B's in bfloat16: 8 KV heads and 16 query heads of 128, embedding rows of
1024 over a 151,936-token vocabulary (sliced in two, as rank 1 of TP=2 holds it). Each op runs
--iters times, captured in one CUDA graph (as a decode step runs them) and replayed between two
CUDA events, best of --rounds; the bandwidth counts the bytes each kernel must read and write at
least once (the gather reads only the rows of ids inside the rank's slice). The H200's L2 cache
holds 50 MB: a call whose data fits would find it there on its next run, so the graph cycles
through independent input sets, enough that over 4 x L2 of other data passes between two calls
on the same set (at most 64 sets: small calls are bound by latency, not bandwidth).
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


def cases(tokens: int) -> list[tuple[str, Callable[[], object], Callable[[], object], int]]:
    """(name, ours, the op it replaces, bytes moved) for `tokens` tokens."""
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
    return [
        ("store_kv", lambda: cuda_kernels.store_kv(k_cache, v_cache, out_loc, k3, v3),
         torch_store, 2 * 2 * tokens * row),
        ("masked_gather", lambda: cuda_kernels.masked_gather(weights, ids, (half, half)),
         torch_gather, (tokens + int((ids >= half).sum())) * HIDDEN * DTYPE.itemsize),
        ("qk_norm_rope", lambda: cuda_kernels.qk_norm_rope(
            positions, q, k, HEAD_DIM, q_weight, k_weight, 1e-6, cache),
         replaced_norm_rope, 2 * tokens * heads),
    ]


def cycling(ops: list[Callable[[], object]]) -> Callable[[], object]:
    """One op per call, taking the sets in turn: a graph of many calls records them in turn."""
    turn = itertools.cycle(ops)
    return lambda: next(turn)()


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
        sets = [cases(tokens)]  # more independent sets until one replay outgrows the L2 cache
        while min(c[3] for c in sets[0]) * len(sets) < 4 * L2_BYTES and len(sets) < 64:
            sets.append(cases(tokens))
        for kernel in zip(*sets):
            name, nbytes = kernel[0][0], sum(c[3] for c in kernel) / len(kernel)
            ours, replaced = (cycling([c[i] for c in kernel]) for i in (1, 2))
            mine = best_microseconds(ours, args.iters, args.rounds)
            theirs = best_microseconds(replaced, args.iters, args.rounds)
            eager = [best_microseconds(op, args.iters, args.rounds, graph=False)
                     for op in (ours, replaced)]
            print(f"{name:<14} {tokens:>7} {mine:>9.2f} {theirs:>12.2f} {theirs / mine:>8.2f}x "
                  f"{nbytes / mine / 1e3:>10.1f} {eager[0]:>15.2f} {eager[1]:>9.2f}")


if __name__ == "__main__":
    main()
