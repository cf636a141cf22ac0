"""What the host does while the GPU waits during the official workload's prefill.

Chapter 21's roofline gives the workload's 9 prefill steps 0.43 s on the engine's stream and
78 ms of idle stream before them, while their kernels take about 0.29 s: about 0.2 s in which
the GPU waits for the host. This runs the official workload's first steps (every prefill step,
then --decode-steps decode steps) under torch.profiler, host and GPU, with the scheduler's and
the engine's phases wrapped in profiler ranges (instance attributes shadow the methods: the
library is not changed), and attributes every GPU gap longer than --gap microseconds to what the
host was doing at its middle: the innermost of our ranges, and the innermost host op.

The profiler slows the host down. --no-profiler times the same phases with the host's clock
instead (each phase's inclusive time summed over the prefill steps, and how long the host
waited for the device in them): whether, without it, the host or the device sets the pace.
--cprofile N adds Python's own profiler over those steps and lists the N functions (ours, and
the C functions they call: a torch op, a kernel's launch) with the most time of their own, and
times every F.linear call of those steps: a shape's first call against its repeats, the slowest
calls, and what the CUDA caching allocator did meanwhile (cudaMalloc, cudaFree, retries).

    python benchmark/gpu/prefill_gaps.py [--model models/qwen3-0.6b-random] [--no-profiler]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import pstats
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark"), str(ROOT / "benchmark/gpu")]
from timeline import RangedEvent, Span, merge, ranged, total  # noqa: E402
from workload_profile import official_llm  # noqa: E402
# The module, not the function the package exports under the same name.
linear_module = importlib.import_module("minisgl.kernel.linear")

# Our ranges, outermost first: a gap is charged to the innermost one around its middle.
PHASES = ("step", "schedule", "process", "wait", "launch", "allocate", "engine.launch",
          "plan", "sampler.prepare", "forward", "sample", "cache_req")


class HostClock:
    """Inclusive host seconds by phase, without a profiler."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


def instrument(scheduler: Any, span: Span) -> list[str]:
    """Wrap the phases in `span`s (profiler ranges, or a HostClock); returns the list that
    collects each launched batch's phase."""
    engine, phases = scheduler.engine, []
    wrap = functools.partial(ranged, span=span)
    launch = wrap("launch", scheduler._launch)

    def noted_launch(batch: Any) -> Any:
        phases.append(f"{batch.phase} {batch.size}")
        return launch(batch)

    process = scheduler._process

    def spanned_process(flight: Any, next_reqs: Any) -> Any:
        with span("process"):
            return process(flight._replace(done=RangedEvent(flight.done, span)), next_reqs)

    scheduler.step = wrap("step", scheduler.step)
    scheduler._schedule = wrap("schedule", scheduler._schedule)
    scheduler._launch, scheduler._process = noted_launch, spanned_process
    scheduler._cache_req = wrap("cache_req", scheduler._cache_req)
    scheduler.cache.allocate = wrap("allocate", scheduler.cache.allocate)
    engine.launch = wrap("engine.launch", engine.launch)
    engine.attn_backend.prepare_metadata = wrap("plan", engine.attn_backend.prepare_metadata)
    engine.sampler.prepare = wrap("sampler.prepare", engine.sampler.prepare)
    engine.model.forward = wrap("forward", engine.model.forward)
    engine._sample = wrap("sample", engine._sample)
    if engine.graphs is not None:
        engine.graphs.replay = wrap("forward", engine.graphs.replay)
    return phases


class LinearTrace:
    """F.linear as chapter 19's linear() calls it, each call timed on the host."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, float]] = []  # rows, output columns, seconds

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        start = time.perf_counter()
        y = torch.nn.functional.linear(x, weight, bias)
        self.calls.append((x.shape[0], weight.shape[0], time.perf_counter() - start))
        return y

    def report(self, allocator: dict[str, int]) -> None:
        seen: set[tuple[int, int]] = set()
        first, repeat = [], []
        for rows, cols, seconds in self.calls:
            (repeat if (rows, cols) in seen else first).append(seconds)
            seen.add((rows, cols))
        print(f"F.linear {len(self.calls)} 次，主机合计 {sum(first + repeat) * 1e3:.1f} ms："
              f"形状第一次出现的 {len(first)} 次 {sum(first) * 1e3:.1f} ms，"
              f"重复的 {len(repeat)} 次 {sum(repeat) * 1e3:.1f} ms")
        slowest = sorted(range(len(self.calls)), key=lambda i: -self.calls[i][2])[:8]
        print("最慢的几次（第几次调用，行数 × 输出列数，ms）：" + "，".join(
            f"{i}：{self.calls[i][0]}×{self.calls[i][1]} {self.calls[i][2] * 1e3:.2f}"
            for i in sorted(slowest)))
        print("同一段时间里 CUDA 缓存分配器：" + "，".join(
            f"{key} {value}" for key, value in allocator.items()))


ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries",
                    "num_sync_all_streams", "num_ooms")


def host_clock_report(scheduler: Any, top: int) -> None:
    """The prefill steps once more, on the host's clock alone (and cProfile's if `top`)."""
    clock = HostClock()
    phases = instrument(scheduler, clock)
    calls, trace = cProfile.Profile(), LinearTrace()
    if top:  # the module's F: only chapter 19's linear() sees the timed one
        linear_module.F = SimpleNamespace(linear=trace.linear)  # type: ignore[assignment]
    before = torch.cuda.memory_stats()
    start = time.perf_counter()
    with calls if top else nullcontext():
        while scheduler.prefill.runnable:
            scheduler.step()
        torch.cuda.synchronize()  # the last prefill's device work is part of the phase
    wall = time.perf_counter() - start
    after = torch.cuda.memory_stats()
    linear_module.F = torch.nn.functional
    print(f"官方负载的 {len(phases)} 个 prefill 步（{', '.join(phases)}），不开 profiler，"
          f"主机的时钟；{torch.cuda.get_device_name()}")
    print(f"  墙钟 {wall * 1e3:.1f} ms；主机在 process 里等 GPU 合计 "
          f"{clock.seconds['wait'] * 1e3:.1f} ms。各阶段（含嵌套在里面的阶段）合计：")
    for name in PHASES:
        print(f"  {name:<18}{clock.seconds[name] * 1e3:>9.1f} ms")
    if top:
        print(f"cProfile 下（它让主机慢一些）自身时间最多的 {top} 个函数：")
        pstats.Stats(calls, stream=sys.stdout).sort_stats("tottime").print_stats(top)
        trace.report({key: after.get(key, 0) - before.get(key, 0) for key in ALLOCATOR_COUNTS})


def innermost(ranges: list[tuple[float, float, str]], at: float,
              keep: Callable[[str], bool]) -> str:
    """The shortest of the ranges around `at` whose name `keep` accepts ("-" if none)."""
    around = [(end - start, name) for start, end, name in ranges
              if start <= at < end and keep(name)]
    return min(around)[1] if around else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--decode-steps", type=int, default=3)
    parser.add_argument("--gap", type=float, default=20.0, help="microseconds")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--no-profiler", dest="profiler", action="store_false",
                        help="time the phases on the host's clock instead")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="with --no-profiler: also cProfile's N costliest functions")
    args = parser.parse_args()
    llm, prompts, params = official_llm(args.model)
    scheduler = llm.backend.scheduler  # type: ignore[union-attr]
    for uid, (prompt, param) in enumerate(zip(prompts, params)):
        scheduler.add_request(uid, prompt, param)
    if not args.profiler:
        host_clock_report(scheduler, args.cprofile)
        llm.shutdown()
        return 0
    phases = instrument(scheduler, record_function)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        while scheduler.prefill.runnable:
            scheduler.step()
        for _ in range(args.decode_steps):
            scheduler.step()
        torch.cuda.synchronize()
    events = list(prof.events())
    host = [e for e in events if e.device_type == DeviceType.CPU]
    thread = next(e.thread for e in host if e.name == "step")
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in host
                   if e.thread == thread)
    device = merge((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == DeviceType.CUDA
                   and not getattr(e, "is_user_annotation", False) and e.name not in PHASES)
    steps = [(s, e) for s, e, name in spans if name == "step"]
    print(f"官方负载的前 {len(steps)} 步（{', '.join(phases)}），profiler 下（主机 + GPU）；"
          f"{torch.cuda.get_device_name()}")
    print(f"  {'步':<16}{'主机 ms':>9}{'GPU 忙 ms':>11}{'GPU 空 ms':>11}")
    for (start, end), phase in zip(steps, phases):
        # A step's GPU work lies between its launch and the next step's end; count the GPU
        # inside the host's step range, which is where the host can keep it waiting.
        busy = total(merge((max(s, start), min(e, end)) for s, e in device
                           if e > start and s < end))
        print(f"  {phase:<16}{(end - start) / 1e3:>9.2f}{busy / 1e3:>11.2f}"
              f"{(end - start - busy) / 1e3:>11.2f}")
    prefill_end = steps[len(steps) - args.decode_steps - 1][1] if args.decode_steps else steps[-1][1]
    gaps = [(end, start) for (_, end), (start, _) in zip(device, device[1:])
            if start - end > args.gap and end < prefill_end]
    ours = lambda name: name in PHASES  # noqa: E731
    by_phase: dict[str, float] = defaultdict(float)
    by_op: dict[tuple[str, str], float] = defaultdict(float)
    for end, start in gaps:
        middle = (end + start) / 2
        phase = innermost(spans, middle, ours)
        by_phase[phase] += (start - end) / 1e3
        by_op[phase, innermost(spans, middle, lambda n: not ours(n))] += (start - end) / 1e3
    idle = sum(start - end for end, start in gaps) / 1e3
    print(f"prefill 期间 GPU 空档（长于 {args.gap:g} 微秒）{len(gaps)} 个，合计 {idle:.1f} ms；"
          "按空档中点时主机在做什么（我们的阶段）：")
    for phase, ms in sorted(by_phase.items(), key=lambda kv: -kv[1]):
        print(f"  {phase:<18}{ms:>9.1f} ms")
    print(f"再细到主机最内层的算子（前 {args.top} 项）：")
    for (phase, op), ms in sorted(by_op.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {phase:<18}{op[:60]:<62}{ms:>9.1f} ms")
    llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
