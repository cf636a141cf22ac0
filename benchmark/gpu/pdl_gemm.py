"""A decode step's 112 GEMMs in one CUDA graph: cuBLAS, a Triton GEMM with and without PDL.

PDL is programmatic dependent launch.

One decode step of the Qwen3-0.6B shape runs 112 GEMMs (28 layers x qkv, o, gate_up, down) on
`rows` tokens. Alone, each costs cuBLAS 5-8 us where its weights at the read speed need 0.9-3
(gemm_shapes.py), and 3.6-7 even with its weights in the L2 (--hot). Part of that may be the
kernel's start, which PDL can overlap with the kernel before it: launched with launch_pdl, a
kernel starts while the previous one still runs, does what does not need that one's output
(index math, and here, optionally, asking the L2 for its own weight panel) and waits for it
only at `gdc_wait`; the previous kernel lets it start early with `gdc_launch_dependents`. The
engine cannot ask cuBLAS for that, so the question is whether a Triton GEMM with PDL is faster
than cuBLAS in a chain, where it matters, rather than alone.

The chain is the 112 GEMMs of one step with 28 layers' own weights (880 MB: none is in the L2
when its turn comes), each reading the output of the one before it where the model does
(o -> gate_up, down -> the next qkv), captured in one CUDA graph and replayed, median of --reps:
- cuBLAS: torch.mm, what F.linear calls;  hot: the same with one layer's weights for all 28;
- Triton: a plain tiled GEMM, its tile per projection and row count the fastest of a sweep
  (each timed in a chain of that projection alone);
- +PDL: the same kernels, launched with launch_pdl; each lets the next one start at once;
- +PDL+L2: the same, and before waiting each kernel asks the L2 for its weight panel.
Bound: the chain's weights and activations at 4.26 TB/s (read_speed.py). The last
column says whether the three Triton variants give the same output to the bit.

    python benchmark/gpu/pdl_gemm.py [--rows 16 64 128 256] [--reps 20]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

LAYERS = 28
HIDDEN, ATTN, INTER = 1024, 2048, 3072  # Qwen3-0.6B: 16 query heads x 128 = 2048
SHAPES = {"qkv": (4096, HIDDEN), "o": (HIDDEN, ATTN), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER)}  # name: (out features N, in features K)
READ_SPEED = 4.26e12  # bytes/s, a read-only kernel on this H200 (read_speed.py)


@triton.jit
def prefetch_l2(pointers):
    # One `prefetch.global.L2` per pointer; the dummy result keeps the asm in the program.
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                     [pointers], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gemm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K].T, one BLOCK_M x BLOCK_N tile a program; K % BLOCK_K == 0,
    N % BLOCK_N == 0 (the four projections)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x = x_ptr + rows[:, None] * K + ks[None, :]
    w = w_ptr + cols[None, :] * K + ks[:, None]  # the tile of w.T: [BLOCK_K, BLOCK_N]
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start now
        if PREFETCH:  # this program's weight panel, one 128-byte line per pointer
            lines = cols[:, None] * K + tl.arange(0, BLOCK_K // 64)[None, :] * 64
            for k in range(0, K, BLOCK_K):
                prefetch_l2(w_ptr + lines + k)
        tl.extra.cuda.gdc_wait()  # x is the previous kernel's output
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(x, mask=rows[:, None] < M, other=0.0)
        b = tl.load(w)
        acc = tl.dot(a, b, acc)
        x += BLOCK_K
        w += BLOCK_K
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=rows[:, None] < M)


Tile = tuple[int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, stages, warps


def triton_mm(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, tile: Tile, pdl: bool,
              prefetch: bool) -> None:
    bm, bn, bk, stages, warps = tile
    (m, k), n = x.shape, w.shape[0]
    gemm_kernel[(n // bn, triton.cdiv(m, bm))](
        x, w, y, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl, PREFETCH=prefetch,
        num_stages=stages, num_warps=warps, launch_pdl=pdl)


def tiles(rows: int) -> list[Tile]:
    return [(bm, bn, bk, stages, 4) for bm, bn, bk, stages in itertools.product(
        (16, 32, 64, 128), (16, 32, 64, 128), (128, 256), (3, 4)) if bm <= max(16, rows)]


def chain_microseconds(chain: Callable[[], None], reps: int) -> float:
    """Median microseconds of one replay of `chain` captured in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first calls compile and allocate, off the graph
        chain()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


class Step:
    """The 112 GEMMs of one decode step on `rows` tokens, with 28 layers' own weights (or one
    layer's, hot), and the buffers they read and write."""

    def __init__(self, rows: int, weights: list[dict[str, torch.Tensor]]) -> None:
        def buffer(n: int) -> torch.Tensor:
            return torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)

        self.weights = weights
        self.hidden, self.attn, self.act = buffer(HIDDEN), buffer(ATTN), buffer(INTER)
        self.qkv, self.o, self.gate_up = buffer(4096), buffer(HIDDEN), buffer(2 * INTER)
        # o's input stands for attention's output, down's for silu(gate) * up: the chain
        # reads o's output in gate_up and down's output in the next layer's qkv, as a model does
        self.inputs = {"qkv": self.hidden, "o": self.attn, "gate_up": self.o, "down": self.act}
        self.outputs = {"qkv": self.qkv, "o": self.o, "gate_up": self.gate_up,
                        "down": self.hidden}

    def run(self, mm: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], None],
            only: str | None = None) -> None:
        for layer in self.weights:
            for name in SHAPES if only is None else (only,):
                mm(name, self.inputs[name], layer[name], self.outputs[name])


def cublas(name: str, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    torch.mm(x, w.t(), out=y)


def best_tiles(step: Step, rows: int, reps: int) -> dict[str, tuple[Tile, float]]:
    """The fastest tile per projection, each timed in a chain of that projection alone."""
    best: dict[str, tuple[Tile, float]] = {}
    for name in SHAPES:
        for tile in tiles(rows):
            try:
                t = chain_microseconds(lambda: step.run(
                    lambda _, x, w, y: triton_mm(x, w, y, tile, False, False), name), reps)
            except OutOfResources:  # too much shared memory for this tile
                continue
            if name not in best or t < best[name][1]:
                best[name] = (tile, t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    weights = [{name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
                for name, (n, k) in SHAPES.items()} for _ in range(LAYERS)]
    weight_bytes = sum(w.numel() * 2 for layer in weights for w in layer.values())
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · triton "
          f"{triton.__version__} · bfloat16 · {LAYERS * len(SHAPES)} GEMMs a step, "
          f"{weight_bytes / 1e6:.0f} MB of weights · median of {args.reps} graph replays, us")
    print(f"{'rows':>4} {'bound':>7} {'cuBLAS':>8} {'hot':>8} {'Triton':>8} {'+PDL':>8} "
          f"{'+PDL+L2':>8}  tiles (qkv o gate_up down: BM BN BK stages)   same output")
    for rows in args.rows:
        step, hot = Step(rows, weights), Step(rows, weights[:1] * LAYERS)
        activations = sum(2 * rows * (n + k) for n, k in SHAPES.values()) * LAYERS
        bound = (weight_bytes + activations) / READ_SPEED * 1e6
        base = chain_microseconds(lambda: step.run(cublas), args.reps)
        in_l2 = chain_microseconds(lambda: hot.run(cublas), args.reps)
        chosen = best_tiles(step, rows, args.reps)
        results, outputs = [], []
        for pdl, prefetch in ((False, False), (True, False), (True, True)):
            def mm(name: str, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
                   pdl: bool = pdl, prefetch: bool = prefetch) -> None:
                triton_mm(x, w, y, chosen[name][0], pdl, prefetch)
            try:
                results.append(chain_microseconds(lambda: step.run(mm), args.reps))
            except Exception as error:  # a variant this Triton cannot build: say so, go on
                print(f"  rows {rows}, pdl={pdl} prefetch={prefetch}: {error!r}"[:300])
                results.append(float("nan"))
                continue
            torch.manual_seed(rows)  # the same inputs for every variant: same output expected
            step.hidden.copy_(torch.randn_like(step.hidden))
            step.run(mm)
            torch.cuda.synchronize()
            outputs.append(step.hidden.clone())
        same = all(torch.equal(outputs[0], o) for o in outputs[1:])
        names = " | ".join(" ".join(map(str, chosen[n][0][:4])) for n in SHAPES)
        print(f"{rows:>4} {bound:>7.1f} {base:>8.1f} {in_l2:>8.1f} "
              + " ".join(f"{t:>8.1f}" for t in results) + f"  {names}   {same}", flush=True)
        alone = "  ".join(f"{n} {chosen[n][1] / LAYERS:.2f}" for n in SHAPES)
        print(f"     Triton alone, us per GEMM in a chain of one projection: {alone}")


if __name__ == "__main__":
    main()
