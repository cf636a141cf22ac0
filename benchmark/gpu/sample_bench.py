"""Chapter 19's sampling kernel at batch 1-256 on Qwen3's vocabulary (151,936 bfloat16 logits a
row, temperature 0.6): microseconds a call and the logits' bytes per second.

Each op runs --iters times captured in one CUDA graph and replayed between two CUDA events, best
of --rounds (minisgl/benchmark/perf.py). The same logits every call: at batch 16 and below they
stay in the L2, as in the engine, where the LM head has just written them. The tokens' sum (seed
1, draw 0) is printed with each time: two trees that draw the same tokens print the same sums.

    python benchmark/gpu/sample_bench.py [--batch 1 4 16 64 256]
    PYTHONPATH=<another tree>/python python benchmark/gpu/sample_bench.py   # that tree's kernel
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# Last: a PYTHONPATH set by the caller (another tree) comes first.
sys.path.append(str(Path(__file__).resolve().parents[2] / "python"))
from minisgl.benchmark.perf import best_microseconds  # noqa: E402
from minisgl.kernel import cuda_kernels  # noqa: E402

VOCAB = 151_936


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64, 128, 256])
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cuda_kernels.set_mode("auto")
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · "
          f"{cuda_kernels.__file__}")
    print(f"# vocabulary {VOCAB:,}, bfloat16, temperature {args.temperature}; best of "
          f"{args.rounds} x {args.iters} calls in a CUDA graph")
    print(f"{'batch':>5} {'kernel µs':>10} {'GB/s':>7} {'tokens sum':>11}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch in args.batch:
        logits = torch.randn(batch, VOCAB, device="cuda", generator=gen).mul_(3).bfloat16()
        temperatures = torch.full((batch,), args.temperature, device="cuda")
        tokens = cuda_kernels.sample(logits, temperatures, seed=1, draw=0)
        assert tokens is not None
        kernel = best_microseconds(lambda: cuda_kernels.sample(logits, temperatures, 1, 0),
                                   args.iters, args.rounds)
        print(f"{batch:>5} {kernel:>10.1f} {logits.numel() * 2 / kernel / 1e3:>7.0f} "
              f"{int(tokens.long().sum()):>11}")


if __name__ == "__main__":
    main()
