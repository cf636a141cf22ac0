"""屋顶线图：算术强度（FLOP/字节）对实测的 FLOP/s，双对数坐标，从记录下来的结果画，不需要 GPU。

屋顶是 min(峰值算力, 强度 × 带宽)，拐点（ridge）在 峰值 / 带宽；带宽和峰值取自屋顶线记录里的
hardware（H200 的规格：4.8 TB/s、989 TFLOP/s），另画一条实测的 4.0 TB/s 拷贝速度
（kernel_bench.py 的 copy 行，book/runs/ch19_kernel_bench.h200.txt）。点：

- 官方负载的 prefill、batch 1 与 batch 256 的 decode：benchmark/roofline.py --json 的逐步记录
  （每一步的浮点运算、必须搬的字节、CUDA event 量的时间），同一类的步加在一起；其余 decode 步画成淡点；
- 一层 Qwen3-30B-A3B 的 MoE（第 20 章 moe_bench.py 的表：图回放的 TFLOP/s 与 GB/s）；
- 第 19 章的 q/k norm + RoPE kernel（kernel_bench.py 的表：16,384 与 256 个 token）。它的浮点运算
  从 qk_norm_rope.cu 数出来：每对数 14 次（平方和 4、归一化与乘权重 4、旋转 6），每个元素 7 次；
  kernel_bench 数的字节是每个元素读写各 2 字节。KV 写入和 gather 只搬数据、没有浮点运算，强度为 0，
  画不到对数坐标上，只在图注里写出它们的带宽。

    python benchmark/roofline_chart.py        # -> book/assets/ch21_roofline_intensity.png
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "book" / "runs"
DEFAULTS = {"steps": RUNS / "ch21_roofline.h200.json", "moe": RUNS / "ch20_moe_bench.h200.txt",
            "kernels": RUNS / "ch19_kernel_bench.h200.txt",
            "out": ROOT / "book" / "assets" / "ch21_roofline_intensity.png"}
COPY_BANDWIDTH = 4.0e12  # minisgl.benchmark.roofline.H200_COPY_BANDWIDTH: measured
QK_FLOPS_PER_ELEMENT = 7  # qk_norm_rope.cu, per pair: a*a + b*b + sum (4), 2 x (x*inv_rms*w) (4),
# the rotation na*cos - nb*sin, nb*cos + na*sin (6)
QK_BYTES_PER_ELEMENT = 4  # as kernel_bench.py counts: a bfloat16 read and written


@dataclass(frozen=True)
class Point:
    label: str
    intensity: float  # FLOP per byte
    flops_per_s: float


def step_points(run: dict[str, Any]) -> tuple[list[Point], list[Point]]:
    """(named points: prefill, decode at batch 1 and 256; one faint point per other decode step)."""
    def total(steps: list[dict[str, Any]], label: str) -> Point:
        flops = sum(s["flops"] for s in steps)
        nbytes = sum(s["weight_bytes"] + s["kv_bytes"] for s in steps)
        return Point(label, flops / nbytes, flops / sum(s["measured_s"] for s in steps))

    steps = run["steps"]
    prefill = [s for s in steps if s["phase"] == "prefill"]
    decode = [s for s in steps if s["phase"] == "decode"]
    named = [total(prefill, f"prefill ({len(prefill)} steps)")]
    for batch in (1, 256):
        chosen = [s for s in decode if s["requests"] == batch]
        if chosen:
            named.append(total(chosen, f"decode, batch {batch} ({len(chosen)} steps)"))
    others = [total([s], "") for s in decode if s["requests"] not in (1, 256)]
    return named, others


def moe_points(text: str) -> list[Point]:
    """The rows of moe_bench.py's table: tokens, experts, four times, speed-up, TFLOP/s, GB/s."""
    row = re.compile(r"^\s*(\d+)\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+([\d.]+)\s+(\d+)\s*$")
    points = []
    for line in text.splitlines():
        if m := row.match(line):
            tokens, tflops, gbps = int(m[1]), float(m[2]), float(m[3])
            points.append(Point(f"MoE layer, {tokens} tok", tflops * 1e12 / (gbps * 1e9),
                                tflops * 1e12))
    return points


def kernel_rates(text: str) -> dict[tuple[str, int], tuple[float, float]]:
    """kernel_bench.py's rows: (name, tokens) -> (our µs, our GB/s)."""
    row = re.compile(r"^(\w+)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+x\s+([\d.]+)\s")
    return {(m[1], int(m[2])): (float(m[3]), float(m[4]))
            for line in text.splitlines() if (m := row.match(line))}


def kernel_points(rates: dict[tuple[str, int], tuple[float, float]]) -> list[Point]:
    intensity = QK_FLOPS_PER_ELEMENT / QK_BYTES_PER_ELEMENT
    return [Point(f"qk_norm_rope, {tokens} tok", intensity, intensity * gbps * 1e9)
            for (name, tokens), (_, gbps) in sorted(rates.items())
            if name == "qk_norm_rope" and tokens > 1]


def plot(named: list[Point], faint: list[Point], bandwidth: float, peak: float,
         copy_notes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ridge = peak / bandwidth
    xs = [0.1, ridge, 2e4]
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot(xs, [min(peak, x * bandwidth) for x in xs], color="black", lw=2,
            label=f"roof: {bandwidth / 1e12:.1f} TB/s, {peak / 1e12:.0f} TFLOP/s bf16 (spec)")
    copy_xs = [0.1, peak / COPY_BANDWIDTH, 2e4]
    ax.plot(copy_xs, [min(peak, x * COPY_BANDWIDTH) for x in copy_xs], color="grey", lw=1,
            ls="--", label=f"{COPY_BANDWIDTH / 1e12:.1f} TB/s (measured copy rate)")
    ax.axvline(ridge, color="black", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak), xytext=(6, -14),
                textcoords="offset points", fontsize=9)
    ax.scatter([p.intensity for p in faint], [p.flops_per_s for p in faint], s=6,
               color="tab:blue", alpha=0.25, label="other decode steps (one dot each)")
    # colour, marker, label offset and alignment: decode labels left of their point, MoE's
    # below right, so that the two series' labels at the same intensity do not overlap
    styles = {"prefill": ("tab:red", "s", (-8, 8), "right"),
              "decode": ("tab:blue", "o", (-8, 6), "right"),
              "MoE": ("tab:green", "^", (8, -12), "left"),
              "qk_norm": ("tab:purple", "D", (8, 2), "left")}
    for p in named:
        colour, marker, offset, align = next(v for k, v in styles.items()
                                             if p.label.startswith(k))
        ax.scatter([p.intensity], [p.flops_per_s], s=60, color=colour, marker=marker,
                   edgecolor="black", zorder=3)
        ax.annotate(p.label, (p.intensity, p.flops_per_s), xytext=offset, ha=align,
                    textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.1, 2e4)
    ax.set_ylim(1e11, 2e15)
    ax.set_xlabel("arithmetic intensity (FLOP / byte that must move)")
    ax.set_ylabel("achieved FLOP/s")
    ax.grid(True, which="major", ls=":", lw=0.5)
    ax.legend(loc="upper left", fontsize=8)
    if copy_notes:
        ax.text(0.99, 0.02, "no FLOPs, not on this axis: " + "; ".join(copy_notes),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=Path, default=default)
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("没有安装 matplotlib，画不了图（pip install matplotlib）", file=sys.stderr)
        return 1
    run = json.loads(args.steps.read_text())
    named, faint = step_points(run)
    named += moe_points(args.moe.read_text())
    rates = kernel_rates(args.kernels.read_text())
    named += kernel_points(rates)
    copy_notes = [f"{name} {gbps / 1e3:.2f} TB/s" for (name, tokens), (_, gbps) in
                  sorted(rates.items()) if name in ("store_kv", "masked_gather")
                  and tokens == max(t for _, t in rates)]
    hw = run["hardware"]
    plot(named, faint, hw["bandwidth"], hw["peak_flops"], copy_notes, args.out)
    for p in named:
        print(f"{p.label:<34} {p.intensity:>9.2f} FLOP/B {p.flops_per_s / 1e12:>9.2f} TFLOP/s")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
