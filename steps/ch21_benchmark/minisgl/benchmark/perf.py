"""GPU time of a small op, without the host's launch cost in it.

A decode step replays its kernels from a CUDA graph (chapter 18), so what a kernel costs there
is its GPU time. Timing eager calls in a loop would measure the host instead: a few-microsecond
kernel behind a Python wrapper is launch-bound. So: capture `iters` calls in one graph, replay
it between two CUDA events, best of `rounds`; `graph=False` times the eager loop the same way,
for ops that cannot be captured (they synchronise with the host) and to show the launch cost.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def best_microseconds(op: Callable[[], object], iters: int, rounds: int,
                      graph: bool = True) -> float:
    """Microseconds per call of op, best of `rounds` runs of `iters` calls."""
    if iters < 1 or rounds < 1:
        raise ValueError(f"iters and rounds must be at least 1, not {iters} and {rounds}")
    if not torch.cuda.is_available():
        raise RuntimeError("best_microseconds times CUDA events: it needs a GPU")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first calls build kernels and workspaces, off the graph
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(side)
    run: Callable[[], object]
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            for _ in range(iters):
                op()
        run = captured.replay
    else:
        def run() -> None:
            for _ in range(iters):
                op()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / iters)
    return best
