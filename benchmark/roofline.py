"""屋顶线：每一步前向的实测时间，对比搬运字节与浮点运算给出的时间下界，按阶段汇总。

每一步必须搬运的字节：全部线性层权重和 norm 各读一次、LM head 读一次、embedding 只读取到的那些行；
各请求已缓存 token 的 K/V 读一次，本步新 token 的 K/V 写一次（中间激活假定都留在片上，不计）。
每一步的浮点运算：线性层每个新 token 2 × 参数量；LM head 只算每个请求的最后一个位置；注意力每个
（query，key）对 4 × 头数 × head_dim，新 token 之间按因果掩码只算一半。一步的下界 =
max(字节 / 带宽, 浮点运算 / 峰值算力)。这套算术在包里：minisgl/benchmark/roofline.py（第 21 章）。

引擎每发射一步（Engine.launch）记一次：GPU 上在引擎的 stream 上前后各记一个 CUDA event，跑完再
统一读出（不逐步同步，以免改变被测的东西），CPU 上用 perf_counter。汇总成 prefill 一行、decode 按
batch 大小分桶各一行：步数、实测、下界、实测/下界、受限于访存还是算力。步与步之间也按阶段分开：
每一步之前引擎的 stream 空等了多久（主机还没把这一步发出来），其余在第一步之前、最后一步之后。
--json 存下所有数字（含每一步），--from-json 用它重算（比如换 --bandwidth），不必再跑；--plot
画柱状图（要 matplotlib）。

    python benchmark/roofline.py                                   # CPU，tiny-qwen3，4 个请求
    python benchmark/roofline.py --device cuda --model models/qwen3-0.6b-random \\
        --workload official --json roofline.json --plot roofline.png
    python benchmark/roofline.py --from-json roofline.json --bandwidth 4.0e12
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from minisgl.benchmark.roofline import (H200_BF16_PEAK, H200_COPY_BANDWIDTH, H200_HBM_BANDWIDTH,
                                       Cost, Hardware, ModelShape, StepShape, decode_bucket,
                                       step_cost)
from minisgl.core import Batch, SamplingParams
from minisgl.engine import InFlight
from minisgl.llm import LLM
from minisgl.models import ModelConfig
from offline import official_workload  # benchmark/offline.py
from report import pad

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# Recorder: every forward the engine launches during one generate()


Stamp = float | torch.cuda.Event  # perf_counter() on the CPU, an event on the stream on CUDA


@dataclass
class Recording:
    steps: list[StepShape]
    seconds: list[float]  # measured, one per step
    wall_seconds: float  # the whole generate()
    # On CUDA, how long the stream idled before each step: from the previous step's end to
    # this one's start, the host not having launched it yet (0 for the first; on the CPU the
    # host's time between the two launches). None in a --json written before it was recorded.
    idle_before: list[float] | None = None


def record(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> Recording:
    """Run generate() with the engine's launch wrapped (the library is left as it is).

    On CUDA, a pair of events on the engine's stream brackets each step. With overlap
    scheduling launch() returns long before the device is done, so host timers would measure
    the launch; events measure the step as the stream runs it: from when the stream reaches
    it (the previous step done) to its last kernel, the wait for its inputs included. A
    host-bound step thus shows its launch overhead; the stream's idle time before a step is
    recorded falls between steps (generate's wall time minus the steps' sum).
    """
    engine = llm.backend.scheduler.engine  # type: ignore[union-attr]  (TP = 1: in this process)
    cuda = engine.device.type == "cuda"
    launch = engine.launch
    lengths: list[tuple[str, list[tuple[int, int]]]] = []
    stamps: list[tuple[Stamp, Stamp]] = []

    def stamp() -> Stamp:
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(engine.stream)
        return event

    def timed_launch(batch: Batch, sampled: list[int]) -> InFlight:
        # Before launch, which advances the lengths; only a cheap copy here, the arithmetic
        # comes after the run, so the host work being measured grows as little as possible.
        lengths.append((batch.phase, [(r.cached_len, r.device_len) for r in batch.reqs]))
        start = stamp()
        launched = launch(batch, sampled)
        stamps.append((start, stamp()))
        return launched

    engine.launch = timed_launch
    try:
        start = time.perf_counter()
        llm.generate(prompts, params, progress=False)
        wall = time.perf_counter() - start
    finally:
        del engine.launch  # the class's method again
    if cuda:
        torch.cuda.synchronize(engine.device)

    def between(a: Stamp, b: Stamp) -> float:
        return a.elapsed_time(b) / 1e3 if cuda else b - a  # type: ignore[operator,union-attr]

    seconds = [between(a, b) for a, b in stamps]
    idle = [0.0] + [between(end, start) for (_, end), (start, _) in zip(stamps, stamps[1:])]
    return Recording([StepShape.of(p, lens) for p, lens in lengths], seconds, wall, idle)


# ----------------------------------------------------------------------------------------------
# A run: what was measured, and its report


@dataclass
class PhaseRow:
    """Steps of one phase (and, for decode, one batch-size bucket), summed."""

    phase: str
    batch_sizes: str  # "2–8": a decode bucket; "" for prefill
    steps: int = 0
    tokens: int = 0
    measured_s: float = 0.0
    bound_s: float = 0.0
    memory_s: float = 0.0  # sum of bytes / bandwidth
    compute_s: float = 0.0  # sum of FLOPs / peak
    memory_bound_steps: int = 0  # steps whose bound is the bytes (the rest: the FLOPs)

    @property
    def ratio(self) -> float:
        return self.measured_s / self.bound_s

    def add(self, step: StepShape, measured: float, cost: Cost, hw: Hardware) -> None:
        self.steps += 1
        self.tokens += step.new_tokens
        self.measured_s += measured
        self.bound_s += cost.bound(hw)
        self.memory_s += cost.memory_seconds(hw)
        self.compute_s += cost.compute_seconds(hw)
        self.memory_bound_steps += cost.memory_bound(hw)


def phase_key(step: StepShape) -> tuple[int, str]:
    """The row a step is summed into, in the order rows are reported: (-1, "") for prefill,
    first; a decode step its batch-size bucket (decode_bucket)."""
    return (-1, "") if step.phase == "prefill" else decode_bucket(step.requests)


def aggregate(steps: list[StepShape], seconds: list[float], model: ModelShape, dtype_bytes: int,
              hw: Hardware) -> list[PhaseRow]:
    """Prefill first, then decode by batch size. A prefill step computes prompt tokens (chunks
    included) and, in the same batch, one token of every running request (chapter 10's mixed
    batch); a decode step only the latter."""
    rows: dict[tuple[int, str], PhaseRow] = {}
    for step, measured in zip(steps, seconds, strict=True):
        key = phase_key(step)
        row = rows.setdefault(key, PhaseRow(step.phase, key[1]))
        row.add(step, measured, step_cost(model, step, dtype_bytes), hw)
    return [rows[key] for key in sorted(rows)]


@dataclass
class Run:
    workload: str
    model: str
    device: str
    dtype: str
    prompt_tokens: list[int]  # per request
    output_tokens: list[int]
    shape: ModelShape
    dtype_bytes: int
    recording: Recording

    def phases(self, hw: Hardware) -> list[PhaseRow]:
        return aggregate(self.recording.steps, self.recording.seconds, self.shape,
                         self.dtype_bytes, hw)

    def to_json(self, hw: Hardware) -> dict[str, Any]:
        steps = []
        idle = self.recording.idle_before or [None] * len(self.recording.steps)
        for step, measured, before in zip(self.recording.steps, self.recording.seconds, idle):
            cost = step_cost(self.shape, step, self.dtype_bytes)
            steps.append({**asdict(step), "measured_s": measured, **asdict(cost),
                          "bound_s": cost.bound(hw), "idle_before_s": before})
        return {"workload": self.workload, "model": self.model, "device": self.device,
                "dtype": self.dtype, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "shape": asdict(self.shape),
                "dtype_bytes": self.dtype_bytes, "hardware": asdict(hw),
                "parameters": self.shape.parameters,
                "weight_bytes_per_step": self.shape.weights_read_per_step * self.dtype_bytes,
                "kv_bytes_per_token": self.shape.kv_per_token * self.dtype_bytes,
                "wall_s": self.recording.wall_seconds,
                "steps_measured_s": sum(self.recording.seconds),
                "phases": [{**asdict(r), "ratio": r.ratio} for r in self.phases(hw)],
                "steps": steps}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        names = StepShape.__dataclass_fields__
        steps = [StepShape(**{k: s[k] for k in names}) for s in data["steps"]]
        idle = [s.get("idle_before_s") for s in data["steps"]]
        recording = Recording(steps, [s["measured_s"] for s in data["steps"]], data["wall_s"],
                              None if None in idle else idle)
        return cls(data["workload"], data["model"], data["device"], data["dtype"],
                   data["prompt_tokens"], data["output_tokens"], ModelShape(**data["shape"]),
                   data["dtype_bytes"], recording)


def binds(row: PhaseRow) -> str:
    """What bounds the row's steps: 访存 (the bytes), 算力 (the FLOPs), or how many of each."""
    compute = row.steps - row.memory_bound_steps
    return ("访存" if not compute else "算力" if not row.memory_bound_steps
            else f"访存 {row.memory_bound_steps}／算力 {compute}")


def print_table(run: Run, hw: Hardware) -> list[PhaseRow]:
    rows, recording = run.phases(hw), run.recording
    steps_s = sum(recording.seconds)
    print(f"{len(run.prompt_tokens)} 个请求，提示词 {sum(run.prompt_tokens):,} 个 token，输出 "
          f"{sum(run.output_tokens):,} 个 token，模型 {Path(run.model).name}，{run.dtype}，"
          f"{run.device}")
    print(f"每步必读的权重 {run.shape.weights_read_per_step * run.dtype_bytes / 1e9:.3f} GB，每个 "
          f"token 的 KV {run.shape.kv_per_token * run.dtype_bytes / 1e3:.1f} KB；带宽 "
          f"{hw.bandwidth / 1e12:.2f} TB/s，峰值算力 {hw.peak_flops / 1e12:.0f} TFLOP/s")
    print(f"generate 墙钟 {recording.wall_seconds:.3f} s：{len(recording.steps)} 步合计 "
          f"{steps_s:.3f} s，步与步之间 {recording.wall_seconds - steps_s:.3f} s")
    header = ["阶段", "步数", "token", "实测 ms", "下界 ms", "实测/下界", "访存 ms", "算力 ms",
              "受限于"]
    widths = [21, 7, 10, 11, 11, 13, 11, 11, 0]
    print("  " + "".join(pad(h, w) for h, w in zip(header, widths)))

    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:,.1f}"

    for r in rows:
        cells = [phase_name(r.batch_sizes), f"{r.steps:,}", f"{r.tokens:,}", ms(r.measured_s),
                 ms(r.bound_s), f"{r.ratio:,.2f}x", ms(r.memory_s), ms(r.compute_s), binds(r)]
        print("  " + "".join(pad(c, w) for c, w in zip(cells, widths)))
    if recording.idle_before is not None:
        print_idle(recording, recording.idle_before)
    return rows


def phase_name(batch_sizes: str) -> str:
    """A row's name: a decode bucket's batch sizes, or "" for prefill (PhaseRow.batch_sizes)."""
    return f"decode，批 {batch_sizes}" if batch_sizes else "prefill"


def print_idle(recording: Recording, idle_before: list[float]) -> None:
    """Where the time between steps goes: the stream's idle time before the steps of each
    phase (and batch-size bucket), and what is left before the first and after the last."""
    idle: dict[tuple[int, str], list[float]] = {}
    for step, before in zip(recording.steps, idle_before, strict=True):
        idle.setdefault(phase_key(step), []).append(before)
    total = sum(idle_before)
    outside = recording.wall_seconds - sum(recording.seconds) - total
    print(f"步与步之间：步前空闲合计 {total:.3f} s（GPU 上是引擎的 stream 等主机发射的时间），"
          f"第一步之前和最后一步之后 {outside:.3f} s")
    header = ["步前空闲", "步数", "合计 ms", "最长 ms", "超过 0.1 ms 的步"]
    widths = [21, 7, 11, 11, 0]
    print("  " + "".join(pad(h, w) for h, w in zip(header, widths)))
    for (_, batch_sizes), values in sorted(idle.items()):
        cells = [phase_name(batch_sizes), f"{len(values):,}",
                 f"{1e3 * sum(values):,.1f}", f"{1e3 * max(values):,.2f}",
                 f"{sum(v > 1e-4 for v in values):,}"]
        print("  " + "".join(pad(c, w) for c, w in zip(cells, widths)))


def plot(rows: list[PhaseRow], hw: Hardware, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU machine
    import matplotlib.pyplot as plt

    # Latin labels: matplotlib's bundled fonts have no CJK glyphs.
    names = ["prefill" if r.phase == "prefill" else f"decode\nbatch {r.batch_sizes}"
             for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 2, 4))
    ax.bar([i - 0.2 for i in x], [r.measured_s for r in rows], 0.4, label="measured")
    bound = f"lower bound ({hw.bandwidth / 1e12:.1f} TB/s, {hw.peak_flops / 1e12:.0f} TFLOP/s)"
    ax.bar([i + 0.2 for i in x], [r.bound_s for r in rows], 0.4, label=bound)
    for i, r in zip(x, rows):
        ax.annotate(f"{r.ratio:,.1f}x", (i, r.measured_s), ha="center", va="bottom")
    ax.set_xticks(list(x), names)
    ax.set_yscale("log")  # prefill and the small decode batches are far below the large ones
    ax.set_ylabel("seconds (sum over steps)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Command line


def small_workload(num_requests: int, seed: int, vocab: int) -> tuple[list[list[int]], list[int]]:
    """Random prompts of 16–64 tokens and outputs of 4–16: a CPU run of a few seconds."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(16, 64))]
               for _ in range(num_requests)]
    return prompts, [rng.randint(4, 16) for _ in range(num_requests)]


def measure(args: argparse.Namespace) -> Run:
    gpu = args.device.startswith("cuda")
    dtype = torch.bfloat16 if gpu else torch.float32
    config = ModelConfig.from_dir(args.model)
    if args.workload == "official":
        prompts, output_lens = official_workload()
        if sum(output_lens) != 133_966:
            raise SystemExit(f"负载与官方不一致：输出 token 总数应为 133,966，"
                             f"这里是 {sum(output_lens):,}")
        # As benchmark/offline.py runs the official workload, which aligns with the official's.
        options = dict(page_size=256, max_seq_len_override=4096, max_prefill_length=16384)
        temperature = 0.6
    else:
        prompts, output_lens = small_workload(args.num_requests, args.seed, config.vocab_size)
        options = dict(num_page_override=16384, max_seq_len_override=512, page_size=1)
        temperature = 0.0
    llm = LLM(args.model, dtype=dtype, device=args.device, max_running_req=len(prompts),
              **options)
    # Warm-up, as offline.py does: kernels' first launches and JIT loading are not steps.
    llm.generate([prompts[0][:50]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature)
              for n in output_lens]
    recording = record(llm, prompts, params)
    llm.shutdown()
    return Run(args.workload, args.model, args.device, str(dtype).removeprefix("torch."),
               [len(p) for p in prompts], output_lens, ModelShape.of(config), dtype.itemsize,
               recording)


def matplotlib_missing() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen3"))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--workload", choices=["small", "official"], default=None,
                        help="small: --num-requests random prompts of 16–64 tokens, outputs of "
                             "4–16; official: the official offline benchmark's 256 requests "
                             "(default: official on cuda, else small)")
    parser.add_argument("--num-requests", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bandwidth", type=float, default=H200_HBM_BANDWIDTH,
                        help=f"bytes/s (default: H200 HBM3e spec; {H200_COPY_BANDWIDTH:.1e} is "
                             f"the copy rate measured on an H200)")
    parser.add_argument("--peak-flops", type=float, default=H200_BF16_PEAK,
                        help="FLOP/s (default: H200 dense bf16 spec)")
    parser.add_argument("--json", metavar="PATH", help="write every number here")
    parser.add_argument("--plot", metavar="PATH", help="bar chart, measured against bound (PNG)")
    parser.add_argument("--from-json", metavar="PATH",
                        help="report a run saved with --json instead of running one")
    args = parser.parse_args(argv)
    args.workload = args.workload or ("official" if args.device.startswith("cuda") else "small")
    hw = Hardware(args.bandwidth, args.peak_flops)
    status = 0
    if args.plot and matplotlib_missing():  # said now, not after a long run
        print(f"--plot {args.plot}：没有安装 matplotlib，不画图（pip install matplotlib）",
              file=sys.stderr)
        args.plot, status = None, 1

    run = (Run.from_json(json.loads(Path(args.from_json).read_text())) if args.from_json
           else measure(args))
    rows = print_table(run, hw)
    if args.json:
        Path(args.json).write_text(json.dumps(run.to_json(hw), indent=1, ensure_ascii=False))
    if args.plot:
        plot(rows, hw, args.plot)
    return status


if __name__ == "__main__":
    sys.exit(main())
