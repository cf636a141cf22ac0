"""The Triton fused MoE (chapter 20) against the torch reference loop, on a GPU, side by side.

    python benchmark/moe_bench.py --tokens 1 64 256 4096 [--sweep] [--profile]

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
--profile lists, per token count, the GPU kernels of one fused forward (routing included) with
their GPU time, from torch.profiler over eager calls: a kernel takes as long eagerly as in a
graph replay, only the gaps between kernels differ, so the sum against the graph column says
how much of a replay is kernels and which of them.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable

import torch
import triton
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

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


def kernel_table(op: Callable[[], object], iters: int,
                 device: torch.device) -> list[tuple[str, float, float]]:
    """(name, launches per call, microseconds per call) of everything op runs on the device,
    busiest first, from torch.profiler over `iters` eager calls after one unrecorded call (which
    builds the kernels). On a GPU the rows are CUDA kernels; on a CPU (the tests' way to run
    this) they are the operators the CPU records, nested ones included."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    op()
    with profile(activities=activities) as prof:
        for _ in range(iters):
            op()
        if cuda:
            torch.cuda.synchronize()
    launches: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    for event in prof.events():
        if event.device_type == wanted:
            launches[event.name] += 1
            busy[event.name] += event.time_range.elapsed_us()
    return [(name, launches[name] / iters, us / iters) for name, us in busy.most_common()]


def format_kernel_table(rows: list[tuple[str, float, float]], indent: int = 7) -> list[str]:
    """The total, then one line per kernel: its time and launches per call, its name."""
    pad = " " * indent
    launches, busy = sum(n for _, n, _ in rows), sum(us for _, _, us in rows)
    lines = [f"{pad}{launches:.0f} kernels, {busy:.1f} us of device time per call"]
    lines += [f"{pad}{us:9.1f} us {n:4.0f}x  {name[:100]}" for name, n, us in rows]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256, 4096])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep", action="store_true", help="also time CANDIDATES tile sizes")
    parser.add_argument("--profile", action="store_true",
                        help="also list the fused forward's GPU kernels and their time")
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
        if args.profile:
            rows = kernel_table(lambda: fused.forward(x, logits, w13, w2, TOP_K, True),
                                args.iters, x.device)
            print("\n".join(format_kernel_table(rows)))


if __name__ == "__main__":
    main()
