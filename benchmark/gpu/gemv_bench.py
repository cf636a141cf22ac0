"""Chapter 19's GEMV kernel against F.linear (cuBLAS) on Qwen3-0.6B's projections at 1-4 rows,
the decode step's matmuls at batch 1-4, where a batch-1 decode step spends most of its GPU time
reading 1.19 GB of weights.

Each op runs --iters times captured in one CUDA graph and replayed between two CUDA events, best
of --rounds (minisgl/benchmark/perf.py). The weights cycle through copies until one cycle holds
4 x the L2, with kernel_bench.py's L2 size and turn-taking, so each call reads its weight from
memory. TB/s counts the weight's bytes only.

    python benchmark/gpu/gemv_bench.py [--rows 1 2 3 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]
from kernel_bench import cycling, weight_copies  # noqa: E402  (the same L2 and turn-taking)
from minisgl.benchmark.perf import best_microseconds  # noqa: E402
from minisgl.kernel import cuda_kernels  # noqa: E402

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
          "down": (1024, 3072), "lm_head": (151936, 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cuda_kernels.set_mode("auto")
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · bfloat16 · "
          f"best of {args.rounds} × {args.iters} calls in a CUDA graph")
    print(f"{'projection':<10} {'rows':>4} {'ours µs':>9} {'F.linear µs':>12} {'speed-up':>9} "
          f"{'ours TB/s':>10} {'cuBLAS TB/s':>12} {'max |diff|':>11}")
    total = {rows: [0.0, 0.0] for rows in args.rows}
    for name, (n_out, k) in SHAPES.items():
        nbytes = n_out * k * 2
        weights = weight_copies(n_out, k)
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ours = best_microseconds(cycling([lambda w=w: cuda_kernels.gemv(x, w)
                                              for w in weights]), args.iters, args.rounds)
            theirs = best_microseconds(cycling([lambda w=w: F.linear(x, w) for w in weights]),
                                       args.iters, args.rounds)
            diff = (cuda_kernels.gemv(x, weights[0]).float()
                    - F.linear(x, weights[0]).float()).abs().max().item()
            total[rows][0] += ours * (28 if name != "lm_head" else 1)
            total[rows][1] += theirs * (28 if name != "lm_head" else 1)
            print(f"{name:<10} {rows:>4} {ours:>9.2f} {theirs:>12.2f} {theirs / ours:>8.2f}x "
                  f"{nbytes / ours / 1e6:>10.2f} {nbytes / theirs / 1e6:>12.2f} {diff:>11.4f}")
        del weights
        torch.cuda.empty_cache()
    for rows, (ours, theirs) in total.items():
        print(f"one decode step's projections (28 layers + LM head) at {rows} rows: "
              f"ours {ours / 1e3:.3f} ms, F.linear {theirs / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
