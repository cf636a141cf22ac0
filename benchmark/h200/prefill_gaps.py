"""What the host does while the GPU waits during the official workload's prefill (issue 27).

Chapter 21's roofline gives the workload's 9 prefill steps 0.43 s on the engine's stream and
78 ms of idle stream before them, while their kernels take about 0.29 s: about 0.2 s in which
the GPU waits for the host. This runs the official workload's first steps (every prefill step,
then --decode-steps decode steps) under torch.profiler, host and GPU, with the scheduler's and
the engine's phases wrapped in profiler ranges (instance attributes shadow the methods: the
library is not changed), and attributes every GPU gap longer than --gap microseconds to what the
host was doing at its middle: the innermost of our ranges, and the innermost host op.

    python benchmark/h200/prefill_gaps.py [--model models/qwen3-0.6b-random]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark"), str(ROOT / "benchmark/h200")]
from timeline import RangedEvent, merge, ranged, total  # noqa: E402
from workload_profile import official_llm  # noqa: E402

# Our ranges, outermost first: a gap is charged to the innermost one around its middle.
PHASES = ("step", "schedule", "process", "wait", "launch", "allocate", "engine.launch",
          "plan", "sampler.prepare", "forward", "sample", "cache_req")


def instrument(scheduler: Any) -> list[str]:
    """Wrap the phases in ranges; returns the list that collects each launched batch's phase."""
    engine, phases = scheduler.engine, []
    launch = ranged("launch", scheduler._launch)

    def noted_launch(batch: Any) -> Any:
        phases.append(f"{batch.phase} {batch.size}")
        return launch(batch)

    process = scheduler._process

    def ranged_process(done: Any, next_reqs: Any) -> Any:
        with record_function("process"):
            return process(done._replace(done=RangedEvent(done.done)), next_reqs)

    scheduler.step = ranged("step", scheduler.step)
    scheduler._schedule = ranged("schedule", scheduler._schedule)
    scheduler._launch, scheduler._process = noted_launch, ranged_process
    scheduler._cache_req = ranged("cache_req", scheduler._cache_req)
    scheduler.cache.allocate = ranged("allocate", scheduler.cache.allocate)
    engine.launch = ranged("engine.launch", engine.launch)
    engine.attn_backend.prepare_metadata = ranged("plan", engine.attn_backend.prepare_metadata)
    engine.sampler.prepare = ranged("sampler.prepare", engine.sampler.prepare)
    engine.model.forward = ranged("forward", engine.model.forward)
    engine._sample = ranged("sample", engine._sample)
    if engine.graphs is not None:
        engine.graphs.replay = ranged("forward", engine.graphs.replay)
    return phases


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
    args = parser.parse_args()
    llm, prompts, params = official_llm(args.model)
    scheduler = llm.backend.scheduler  # type: ignore[union-attr]
    for uid, (prompt, param) in enumerate(zip(prompts, params)):
        scheduler.add_request(uid, prompt, param)
    phases = instrument(scheduler)
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
