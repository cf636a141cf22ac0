"""重叠调度的时间线：主机的调度藏在设备的计算底下（重叠开），或者和它轮流（重叠关），同一次运行里并排。

每种模式各建一个 LLM（CUDA Graph 保持默认），先把 --batch 个请求全部 prefill 完，热身 --warmup
步 decode，再用 torch.profiler 记 --steps 步。调度器的几个阶段在运行时套上 record_function
（不改库代码），于是 trace 里有主机一侧的区间：
- schedule：Scheduler._schedule，挑出下一个 batch；
- launch：Scheduler._launch，分配页、准备输入、把前向（graph replay）排进设备的流；
- process：Scheduler._process，读回一个 batch 的 token、判断结束、释放；
- wait：process 里等设备算完那个 batch 的时间（它的 done 事件的 synchronize）。
设备一侧是 GPU 上的 kernel 和拷贝，合并成忙碌区间。打印每种模式的毫秒/步、设备忙碌比例、
每步各阶段的主机时间；--json 存下全部区间（没有 GPU 也能重画），--plot 画图，--from-json 只重画。

负载：默认是官方 offline 基准负载的前 --batch 个请求（benchmark/offline.py 的 official_workload，
temperature 0.6，ignore_eos），或 --workload random（--prompt-len 个随机 token）。

真正的图要在 GPU 上跑。没有 CUDA 时脚本照样从头跑到尾（用于测试）：那时前向在主机上同步执行，
“设备”一栏画的是模型前向在 CPU 上的区间，没有什么可以重叠。

    python benchmark/timeline.py --device cuda --model models/qwen3-0.6b-random \\
        --json timeline.json --plot timeline.png
    python benchmark/timeline.py --from-json timeline.json --plot timeline.png   # 只重画
    python benchmark/timeline.py --device cpu --model models/tiny-qwen3 --workload random \\
        --batch 4 --prompt-len 16 --steps 4
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from offline import official_workload, release_memory
from report import pad

ROOT = Path(__file__).resolve().parent.parent
Interval = tuple[float, float]  # (start, end) in ms
HOST_PHASES = ("schedule", "launch", "process", "wait")  # "wait" lies inside "process"
MODES = {"on": True, "off": False}  # JSON key -> overlap


# ----------------------------------------------------------------------------------------------
# Intervals


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals as sorted, disjoint intervals (kernels on several streams overlap)."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def total(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def busy_fraction(busy: Iterable[Interval], window: Interval) -> float:
    """Share of the window covered by the busy intervals (counted once where they overlap)."""
    return total(merge(clip(busy, window))) / (window[1] - window[0])


def extract(events: Iterable[Any], device_source: str) -> dict[str, Any]:
    """Host phase ranges, step ranges and device busy intervals from profiler events, in ms
    from the start of the first measured step.

    The profiled loop runs one lead-in step before the measured ones: the profiler's first step
    pays its start-up, and with overlap the lead-in's batch is the one the first measured step
    waits for, so its kernels must be in the trace but not its host work. `device_source` is
    "cuda" (the device's kernels and copies) or "cpu" (the model forward's ranges on the host)."""
    events = list(events)
    host_events = [e for e in events if e.device_type == DeviceType.CPU]
    steps = sorted((e.time_range.start, e.time_range.end) for e in host_events if e.name == "step")
    if len(steps) < 2:
        raise ValueError(f"the trace has {len(steps)} step ranges; a lead-in and one more needed")
    thread = next(e.thread for e in host_events if e.name == "step")  # the scheduler's thread

    def ranges(name: str) -> list[Interval]:
        return [(e.time_range.start, e.time_range.end) for e in host_events
                if e.name == name and e.thread == thread]

    if device_source == "cuda":
        # Kernels and copies; our record_function ranges mirrored onto the GPU's timeline
        # ("gpu_user_annotation") are no work.
        device = [(e.time_range.start, e.time_range.end) for e in events
                  if e.device_type == DeviceType.CUDA
                  and not getattr(e, "is_user_annotation", False)
                  and e.name not in ("step", "forward", *HOST_PHASES)]
    else:
        device = ranges("forward")
    steps = steps[1:]  # drop the lead-in
    window_us = (steps[0][0], steps[-1][1])

    def relative(intervals: Iterable[Interval]) -> list[list[float]]:
        return [[round((s - window_us[0]) / 1000, 4), round((e - window_us[0]) / 1000, 4)]
                for s, e in clip(intervals, window_us)]

    return {"window": [0.0, round((window_us[1] - window_us[0]) / 1000, 4)],
            "steps": relative(steps),
            "host": {phase: relative(ranges(phase)) for phase in HOST_PHASES},
            "device": relative(merge(device)),
            "device_source": device_source,
            "device_events": len(device)}


def summarize(trace: dict[str, Any]) -> dict[str, float]:
    """Per step: wall time, device busy time and share, and each host phase's time."""
    window, steps = tuple(trace["window"]), len(trace["steps"])
    per_step = {phase: total(map(tuple, trace["host"][phase])) / steps for phase in HOST_PHASES}
    busy = total(map(tuple, trace["device"]))
    return {"ms_per_step": (window[1] - window[0]) / steps,
            "device_busy_ms_per_step": busy / steps,
            "device_busy": busy / (window[1] - window[0]),
            # Time the host computes rather than waits for the device.
            "host_work_ms_per_step": per_step["schedule"] + per_step["launch"]
            + per_step["process"] - per_step["wait"],
            **{f"{phase}_ms_per_step": ms for phase, ms in per_step.items()}}


# ----------------------------------------------------------------------------------------------
# A profiled run


# What a range is: a profiler range by default (prefill_gaps.py also passes a host clock).
Span = Callable[[str], AbstractContextManager[Any]]


def ranged(name: str, fn: Callable[..., Any], span: Span = record_function) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with span(name):
            return fn(*args, **kwargs)
    return wrapper


class RangedEvent:
    """A batch's `done` event whose synchronize() is a range: the host waiting for the
    device."""

    def __init__(self, event: Any, span: Span = record_function) -> None:
        self.event, self.span = event, span

    def synchronize(self) -> None:
        with self.span("wait"):
            self.event.synchronize()


def instrument(scheduler: Any) -> list[list[Any]]:
    """Wrap the scheduler's phases in profiler ranges. Instance attributes shadow the class's
    methods, so step() calls the wrappers and the library stays as it is. Returns the list
    that collects each launched batch's (phase, size)."""
    launched: list[list[Any]] = []  # [phase, size]: lists, as they read back from JSON
    scheduler.step = ranged("step", scheduler.step)
    scheduler._schedule = ranged("schedule", scheduler._schedule)
    launch = ranged("launch", scheduler._launch)
    process = scheduler._process

    def counted_launch(batch: Any) -> Any:
        launched.append([batch.phase, batch.size])
        return launch(batch)

    def ranged_process(flight: Any, in_flight: Any) -> Any:
        with record_function("process"):  # InFlight is a NamedTuple: swap its event for ours
            return process(flight._replace(done=RangedEvent(flight.done)), in_flight)

    scheduler._launch, scheduler._process = counted_launch, ranged_process
    # The forward's host ranges: the "device" lane where the device is the CPU.
    engine = scheduler.engine
    engine.model.forward = ranged("forward", engine.model.forward)
    if engine.graphs is not None:
        engine.graphs.replay = ranged("forward", engine.graphs.replay)
    return launched


def requests(args: argparse.Namespace) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) of each request."""
    if args.workload == "official":
        prompts, output_lens = official_workload()
        return list(zip(prompts, output_lens))[:args.batch]
    # Enough tokens that nobody finishes: warm-up, lead-in, measured and timed steps, and the
    # decode steps that run between chunks of a long prefill.
    max_tokens = args.warmup + 2 * args.steps + 64
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(100, 10000, (args.prompt_len,), generator=gen).tolist(), max_tokens)
            for _ in range(args.batch)]


def synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def run_mode(args: argparse.Namespace, overlap: bool) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    reqs = requests(args)
    llm = LLM(args.model, dtype=getattr(torch, args.dtype), device=args.device, overlap=overlap,
              attention_backend=args.attn, max_running_req=args.batch, page_size=args.page_size,
              max_seq_len_override=max(len(p) + n for p, n in reqs),
              max_prefill_length=16384)
    try:
        scheduler = llm.backend.scheduler  # type: ignore[union-attr]
        graphs = scheduler.engine.graphs is not None
        for uid, (prompt, max_tokens) in enumerate(reqs):
            scheduler.add_request(uid, prompt, SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, temperature=0.6))
        launched = instrument(scheduler)
        while scheduler.prefill.runnable:  # every prompt (decode steps run between chunks)
            scheduler.step()
        for _ in range(args.warmup):
            scheduler.step()
        launched.clear()
        activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
        with profile(activities=activities) as prof:
            for _ in range(1 + args.steps):  # a lead-in step, then the measured ones
                scheduler.step()
            synchronize(cuda)  # the last batch's kernels finish inside the trace
        window = launched[1:]
        # The same number of steps without the profiler, which slows the host's every op.
        scheduler.step()
        start = time.perf_counter()
        for _ in range(args.steps):
            scheduler.step()
        plain = (time.perf_counter() - start) * 1000 / args.steps
        synchronize(cuda)
    finally:
        scheduler = None
        llm.shutdown()
        del llm
        release_memory()  # the next mode's KV pool is sized from the free memory
    trace = extract(prof.events(), "cuda" if cuda else "cpu")
    return {"overlap": overlap, "cuda_graph": graphs, "launched": window,
            "ms_per_step_unprofiled": round(plain, 4), **trace,
            "summary": summarize(trace)}


# ----------------------------------------------------------------------------------------------
# Report and figure


def print_summary(data: dict[str, Any]) -> None:
    device = "GPU" if data["device_source"] == "cuda" else "设备"
    print(f"重叠调度的时间线：{Path(data['model']).name}，batch {data['batch']}"
          f"（{data['workload_text']}），{data['dtype']}，{data['device_name']}，"
          f"{data['steps']} 步 decode（毫秒/步）")
    header = ["", "墙钟", "不开profiler", f"{device}忙", f"{device}忙时间", "主机干活",
              *HOST_PHASES]
    print(("  " + "".join(pad(h, 14) for h in header)).rstrip())
    for mode in data["modes"].values():
        s, name = mode["summary"], f"重叠{'开' if mode['overlap'] else '关'}"
        cells = [name, f"{s['ms_per_step']:.3f}", f"{mode['ms_per_step_unprofiled']:.3f}",
                 f"{s['device_busy']:.1%}", f"{s['device_busy_ms_per_step']:.3f}",
                 f"{s['host_work_ms_per_step']:.3f}",
                 *(f"{s[f'{p}_ms_per_step']:.3f}" for p in HOST_PHASES)]
        print(("  " + "".join(pad(c, 14) for c in cells)).rstrip())
        if odd := [b for b in mode["launched"] if b != ["decode", data["batch"]]]:
            print(f"  注意：{name}的窗口里有 {len(odd)} 个 batch 不是 {data['batch']} 个请求的 "
                  f"decode：{odd[:4]}")
        if mode["device_source"] == "cuda" and not mode["device_events"]:
            print(f"  注意：{name}时 profiler 没有记录到任何 GPU kernel，设备一栏是空的")
    print(f"主机干活 = schedule + launch + process − wait；wait 是 process 里等{device}算完的时间"
          + ("。" if device == "GPU" else "；CPU 上前向在 launch 里同步执行，忙碌的是主机自己。"))


COLORS = {"schedule": "tab:blue", "launch": "tab:orange", "process": "tab:green",
          "wait": "lightgray", "device": "tab:red"}


def plot(data: dict[str, Any], path: str) -> None:
    """Two panels, overlap on above off, on one time scale. Lanes: each host phase, the wait
    drawn over the process lane (so green is the host's own work), and the device. Labels in
    English: the machine that draws it may have no CJK font."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    modes = list(data["modes"].values())
    device = "GPU" if data["device_source"] == "cuda" else "forward (CPU)"
    lanes = ["schedule", "launch", "process", "device"]  # top to bottom
    labels = {"schedule": "host: schedule", "launch": "host: launch", "process": "host: process",
              "wait": "host: waiting for the device (in process)", "device": device}
    fig, axes = plt.subplots(len(modes), 1, figsize=(14, 1.4 + 1.6 * len(modes)), sharex=True,
                             squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        spans = {**mode["host"], "device": mode["device"]}
        for lane, layers in [("schedule", ["schedule"]), ("launch", ["launch"]),
                             ("process", ["process", "wait"]), ("device", ["device"])]:
            y = len(lanes) - 1 - lanes.index(lane)
            for layer in layers:
                ax.broken_barh([(start, end - start) for start, end in spans[layer]],
                               (y - 0.4, 0.8), color=COLORS[layer], linewidth=0)
        for start, _ in mode["steps"]:
            ax.axvline(start, color="black", linewidth=0.5, linestyle=":")
        ax.set_yticks(range(len(lanes)), [labels[lane] for lane in reversed(lanes)])
        s = mode["summary"]
        ax.set_title(f"overlap {'on' if mode['overlap'] else 'off'}: "
                     f"{s['ms_per_step']:.2f} ms/step, {device} busy {s['device_busy']:.0%}, "
                     f"host work {s['host_work_ms_per_step']:.2f} ms/step", fontsize=10)
    axes[-1, 0].set_xlabel("time (ms); dotted lines: step starts")
    axes[-1, 0].set_xlim(0, max(mode["window"][1] for mode in modes))
    fig.suptitle(f"Overlap scheduling, {Path(data['model']).name}, batch {data['batch']}, "
                 f"{data['dtype']}, {data['device_name']}, {data['steps']} decode steps",
                 x=0.01, y=0.99, ha="left", va="top")
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    fig.legend(handles=[Patch(color=COLORS[k], label=labels[k]) for k in [*lanes[:3], "wait",
                                                                           "device"]],
               loc="upper left", bbox_to_anchor=(0.01, 0.95), ncol=5, fontsize=8, frameon=False)
    fig.savefig(path, dpi=150)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "qwen3-0.6b-random"))
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="default: bfloat16 on cuda, float32 on the CPU")
    parser.add_argument("--attn", default="auto", help="attention backend (chapter 17)")
    parser.add_argument("--workload", choices=["official", "random"], default="official")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512, help="--workload random only")
    parser.add_argument("--page-size", type=int, default=256, help="as offline.py's official run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", help="save the intervals and the summary here")
    parser.add_argument("--plot", help="draw the figure here (PNG, SVG, PDF)")
    parser.add_argument("--from-json", help="no run: report and redraw a saved --json")
    args = parser.parse_args(argv)
    drawable = importlib.util.find_spec("matplotlib") is not None
    if args.plot and not drawable and (args.from_json or not args.json):
        parser.error("--plot needs matplotlib, which is not installed (with --json, a run "
                     "saves what it measured, to redraw elsewhere with --from-json)")

    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        cuda = args.device.startswith("cuda")
        if cuda and not torch.cuda.is_available():
            parser.error("--device cuda, but CUDA is not available")
        if args.steps < 1 or args.warmup < 0:
            parser.error(f"--steps {args.steps} --warmup {args.warmup}: need at least one "
                         f"measured step and no negative warm-up")
        if args.workload == "official" and not 1 <= args.batch <= 256:
            parser.error(f"--batch {args.batch}: the official workload has 256 requests")
        args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
        data = {"model": args.model, "batch": args.batch, "steps": args.steps,
                "dtype": args.dtype, "workload": args.workload,
                "workload_text": (f"官方负载的前 {args.batch} 个请求" if args.workload == "official"
                                  else f"随机提示词 {args.prompt_len} 个 token"),
                "device_name": (torch.cuda.get_device_name() if cuda
                                else platform.processor() or "CPU"),
                "torch": torch.__version__, "modes": {}}
        for key, overlap in MODES.items():
            data["modes"][key] = run_mode(args, overlap)
        data["device_source"] = data["modes"]["on"]["device_source"]
        if args.json:  # before plotting: a failed plot can be redrawn from it
            Path(args.json).write_text(json.dumps(data, ensure_ascii=False))
    print_summary(data)
    if args.plot and not drawable:
        print(f"没有 matplotlib，没有画图；在装了它的机器上重画：python benchmark/timeline.py "
              f"--from-json {args.json} --plot {args.plot}", file=sys.stderr)
        return 1
    if args.plot:
        plot(data, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
