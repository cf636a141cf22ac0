"""Qwen3-0.6B's four projections at decode batch sizes 16-256: cuBLAS as F.linear
calls it, cuBLAS through cublasLt, and a plain Triton matmul at the best of a sweep of tile
shapes, each against the shape's bound.

At batch 256 a decode step's matmuls take more than twice what their FLOPs at the H200's peak
and their weights at its bandwidth allow (decode_profile.py splits a step's GPU time): is that
cuBLAS's tile choice for these skinny shapes, or what any kernel gets? The Triton
kernel is the textbook one (a tile of rows by a tile of columns, the K loop pipelined by
Triton): if a tile shape of it beats cuBLAS here, a tuned kernel has room; if none does, the
gap is not the tile choice.

Each op runs --iters times captured in one CUDA graph and replayed between two CUDA events, best
of --rounds (minisgl/benchmark/perf.py); the weights cycle through copies until a cycle holds
4 x the L2 (kernel_bench.py), as 28 layers' weights do.

    python benchmark/gpu/gemm_shapes.py [--rows 16 32 64 128 256] [--hot] [--no-triton]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.runtime.errors import OutOfResources

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]
from kernel_bench import cycling, weight_copies  # noqa: E402
from minisgl.benchmark.perf import best_microseconds  # noqa: E402
from pdl_gemm import triton_mm  # noqa: E402  (its kernel without PDL: the textbook tiled GEMM)

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
PEAK_FLOPS, BANDWIDTH = 989e12, 4.8e12  # H200 bfloat16 dense, HBM3e (chapter 21's roofline)


def configs(rows: int) -> list[tuple]:
    return [(bm, bn, bk, stages, warps) for bm, bn, bk, stages, warps in itertools.product(
        (16, 32, 64, 128), (64, 128, 256), (64, 128), (3, 4), (4, 8)) if bm <= max(16, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--iters", type=int, default=56)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hot", action="store_true",
                        help="one copy of each weight, in the L2 after the first call")
    parser.add_argument("--no-triton", action="store_true", help="cuBLAS only")
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · triton "
          f"{triton.__version__} · bfloat16 · best of {args.rounds} x {args.iters} calls in a "
          "CUDA graph")
    print(f"{'projection':<8} {'rows':>4} {'bound µs':>9} {'F.linear':>9} {'cublasLt':>9} "
          f"{'Triton':>8}  best tile (BM BN BK stages warps)  max |diff|")
    per_layer = {rows: [0.0, 0.0, 0.0, 0.0] for rows in args.rows}
    default_blas = torch.backends.cuda.preferred_blas_library()
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        weights = weight_copies(n, k, copies=1 if args.hot else None)
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            bound = max(2 * rows * n * k / PEAK_FLOPS, (nbytes + 2 * rows * (n + k)) / BANDWIDTH)
            cublas = best_microseconds(cycling([lambda w=w: F.linear(x, w) for w in weights]),
                                       args.iters, args.rounds)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = best_microseconds(cycling([lambda w=w: F.linear(x, w) for w in weights]),
                                   args.iters, args.rounds)
            torch.backends.cuda.preferred_blas_library(default_blas)
            best, best_config = float("inf"), None
            for config in [] if args.no_triton else configs(rows):
                try:
                    t = best_microseconds(cycling([
                        lambda w=w: triton_mm(x, w, y, config, False, False) for w in weights]),
                        args.iters, args.rounds)
                except OutOfResources:  # too much shared memory for this tile: skip it
                    continue
                if t < best:
                    best, best_config = t, config
            diff = float("nan")
            if best_config is not None:
                triton_mm(x, weights[0], y, best_config, False, False)
                diff = (y.float() - F.linear(x, weights[0]).float()).abs().max().item()
            for i, t in enumerate((bound * 1e6, cublas, lt, best)):
                per_layer[rows][i] += t
            print(f"{name:<8} {rows:>4} {bound * 1e6:>9.2f} {cublas:>9.2f} {lt:>9.2f} "
                  f"{best:>8.2f}  {' '.join(map(str, best_config or ['-'])):<34} {diff:.4f}",
                  flush=True)
    print("the four per layer, x 28 layers (ms per decode step):")
    for rows, (bound, cublas, lt, best) in per_layer.items():
        print(f"  rows {rows:>4}: bound {bound * 28e-3:.3f}  F.linear {cublas * 28e-3:.3f}  "
              f"cublasLt {lt * 28e-3:.3f}  Triton {best * 28e-3:.3f}")


if __name__ == "__main__":
    main()
