#!/usr/bin/env python3
"""Draws chapter 19's picture of the warp-shuffle butterfly in qk_norm_rope.cu: 32 lanes, five
rounds of `sum += __shfl_xor_sync(mask, sum, offset)` with offset 16, 8, 4, 2, 1. The edges that
feed lane 0's final sum are highlighted: after round r a lane holds the sum of 2^r lanes, after
five rounds every lane holds all 32. Writes a plain SVG (no dependencies):

    python tools/draw_shuffle_butterfly.py            # -> book/assets/ch19_shuffle_butterfly.svg
"""

from __future__ import annotations

import argparse
from pathlib import Path

LANES = 32
OFFSETS = (16, 8, 4, 2, 1)  # the kernel's loop: offset = kLanes / 2; offset > 0; offset /= 2
OUT = Path(__file__).resolve().parent.parent / "book" / "assets" / "ch19_shuffle_butterfly.svg"

LEFT, TOP, DX, DY = 190, 56, 22, 70
WIDTH, HEIGHT = LEFT + DX * LANES + 24, TOP + DY * len(OFFSETS) + 104
GREY, BLUE, ORANGE, INK = "#c9ced6", "#8fb3e0", "#e8710a", "#202124"


def x(lane: int) -> float:
    return LEFT + DX * lane + DX / 2


def y(level: int) -> float:
    return TOP + DY * level


def sources_of_lane0() -> list[set[int]]:
    """For each level 0..5, the lanes whose value at that level reaches lane 0 at the end."""
    cone = [set() for _ in range(len(OFFSETS) + 1)]
    cone[-1] = {0}
    for level in range(len(OFFSETS), 0, -1):
        offset = OFFSETS[level - 1]
        cone[level - 1] = {lane for l in cone[level] for lane in (l, l ^ offset)}
    return cone


def svg() -> str:
    cone = sources_of_lane0()
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="13">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15" fill="{INK}">一个 warp 的 32 个 lane：'
           f'sum += __shfl_xor_sync(0xffffffff, sum, offset)</text>']
    for lane in range(LANES):  # lane numbers above the first row
        out.append(f'<text x="{x(lane):.1f}" y="{TOP - 14}" font-size="10" fill="{INK}" '
                   f'text-anchor="middle">{lane}</text>')
    out.append(f'<text x="{LEFT - 12}" y="{TOP - 14}" font-size="11" fill="{INK}" '
               f'text-anchor="end">lane</text>')
    # Edges first, the highlighted ones last so that they are drawn on top.
    plain, lit = [], []
    for level, offset in enumerate(OFFSETS, start=1):
        for lane in range(LANES):
            for source, colour in ((lane, GREY), (lane ^ offset, BLUE)):
                hot = lane in cone[level] and source in cone[level - 1]
                line = (f'<line x1="{x(source):.1f}" y1="{y(level - 1) + 6}" x2="{x(lane):.1f}" '
                        f'y2="{y(level) - 6}" stroke="{ORANGE if hot else colour}" '
                        f'stroke-width="{2.2 if hot else 1}"/>')
                (lit if hot else plain).append(line)
    out += plain + lit
    labels = ["开始：各自的部分和"] + [
        f"第 {r} 轮：加上 lane ⊕ {offset} 的" for r, offset in enumerate(OFFSETS, start=1)]
    for level, label in enumerate(labels):
        out.append(f'<text x="{LEFT - 12}" y="{y(level) + 4}" fill="{INK}" '
                   f'text-anchor="end">{label}</text>')
        for lane in range(LANES):
            hot = lane in cone[level]
            out.append(f'<circle cx="{x(lane):.1f}" cy="{y(level)}" r="5" '
                       f'fill="{ORANGE if hot else "white"}" stroke="{INK}" stroke-width="1"/>')
    bottom = y(len(OFFSETS)) + 34
    out.append(f'<text x="{LEFT}" y="{bottom}" fill="{INK}">灰线：自己的值；蓝线：对方 lane 的值；'
               f'橙色：最后流进 lane 0 的那些</text>')
    out.append(f'<text x="{LEFT}" y="{bottom + 22}" fill="{INK}">第 r 轮之后每个 lane 持有 2^r '
               f'个 lane 的和；5 轮之后 32 个 lane 都是整个头的平方和，</text>')
    out.append(f'<text x="{LEFT}" y="{bottom + 44}" fill="{INK}">逐位相同，不经过共享内存，'
               f'不需要 __syncthreads()</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(svg(), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
