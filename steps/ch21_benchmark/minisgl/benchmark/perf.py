"""GPU time of a small op as a decode graph pays it: `iters` calls captured in one CUDA graph,
replayed between two CUDA events, best of `rounds`. `graph=False` times the eager loop the same
way (ops that cannot be captured; the host's launch cost)."""

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
