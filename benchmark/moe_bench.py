"""The Triton fused MoE (chapter 20) against the torch reference loop, on a GPU, side by side.

    python benchmark/moe_bench.py --tokens 1 64 256 4096 [--sweep]

One MoE layer of Qwen3-30B-A3B's shape in bfloat16 with random weights: 128 experts, top-8
(renormalised), hidden 2048, moe_intermediate_size 768. Each backend's forward (routing
included) runs --iters times between two CUDA events, best of --rounds: the torch reference
eagerly (it reads the chosen experts back to the host, so no graph can hold it, and the engine
runs it without graphs), the fused one eagerly and replayed from a CUDA graph (as the engine's
decode runs it; prefill runs it eagerly). TFLOP/s counts the
useful multiply-adds (6 * tokens * top_k * hidden * inter FLOPs); GB/s the bytes that must
move at least once: the weights of the experts the batch chose, x and the output.
--sweep also times fused_moe alone (routing excluded) with a few tile configurations per token
count, to tune kernel/fused_moe.py's default_config.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import triton

from minisgl.benchmark.perf import best_microseconds
from minisgl.kernel.fused_moe import GemmConfig, default_config, fused_moe
from minisgl.moe import TorchMoEBackend, TritonMoEBackend, select_experts

DTYPE = torch.bfloat16
EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
CANDIDATES = [GemmConfig(m, n, k, warps, stages)
              for m, n, k, warps, stages in [(16, 64, 64, 4, 3), (16, 64, 128, 4, 4),
                                             (16, 128, 64, 4, 3), (32, 64, 64, 4, 3),
                                             (64, 64, 64, 4, 3), (64, 128, 64, 8, 3),
                                             (64, 128, 64, 4, 4), (128, 128, 64, 8, 3)]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256, 4096])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep", action="store_true", help="also time CANDIDATES tile sizes")
    args = parser.parse_args()

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; {EXPERTS} experts, top-{TOP_K}, hidden {HIDDEN}, "
          f"inter {INTER}, {DTYPE}")
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda") / HIDDEN ** 0.5).to(DTYPE)
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda") / INTER ** 0.5).to(DTYPE)
    expert_bytes = (w13[0].numel() + w2[0].numel()) * DTYPE.itemsize
    reference, fused = TorchMoEBackend(), TritonMoEBackend()

    print(f"{'tokens':>6} {'experts':>7} {'torch ref us':>12} {'fused eager us':>14} "
          f"{'fused graph us':>14} {'speedup':>7} {'TFLOP/s':>8} {'GB/s':>6}  (of the graph)")
    for tokens in args.tokens:
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=DTYPE)
        logits = torch.randn(tokens, EXPERTS, device="cuda", dtype=DTYPE)
        weights, ids = select_experts(logits, TOP_K, renormalize=True)
        chosen = int(ids.unique().numel())
        flops = 6 * tokens * TOP_K * HIDDEN * INTER
        moved = chosen * expert_bytes + 2 * x.numel() * DTYPE.itemsize
        ref_us = best_microseconds(lambda: reference.forward(x, logits, w13, w2, TOP_K, True),
                                   args.iters, args.rounds, graph=False)
        eager_us, fused_us = (best_microseconds(
            lambda: fused.forward(x, logits, w13, w2, TOP_K, True), args.iters, args.rounds,
            graph=graph) for graph in (False, True))
        print(f"{tokens:>6} {chosen:>7} {ref_us:>12.1f} {eager_us:>14.1f} {fused_us:>14.1f} "
              f"{ref_us / fused_us:>6.1f}x {flops / fused_us / 1e6:>8.2f} "
              f"{moved / fused_us / 1e3:>6.0f}")
        if args.sweep:
            default = default_config(tokens * TOP_K, EXPERTS)
            for config in CANDIDATES:
                us = best_microseconds(lambda: fused_moe(x, w13, w2, weights, ids, config),
                                       args.iters, args.rounds)
                mark = "  <- default" if config == default else ""
                print(f"{'':>6} {config} {us:9.1f} us{mark}")


if __name__ == "__main__":
    main()
