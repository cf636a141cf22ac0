"""How fast can a kernel read a decode step's keys and values on this GPU (issue 27)?

Chapter 19's decode attention reads a batch-256 layer's K/V at about 4.0 TB/s, as fast as
torch copies memory; the roofline's bound assumes the data sheet's 4.8. Is the rest of the way
reachable by a kernel that only reads, and does the order it reads in matter? The pool is laid
out token by token ([slot, kv head, head dim], NHD): a block that serves one KV head, as ours
does, reads 256 bytes of every 2 KB row. Three Triton kernels read the same bytes (a sum per
block, so nothing is written to speak of):

  head  one block a (request, KV head), NHD pool: 256 B from each 2 KB row (our kernel's order)
  row   one block a (request, chunk of tokens), NHD pool: whole 2 KB rows, every head
  run   one block a (request, KV head), head-major pool ([head, slot, dim], HND): one
        contiguous run of the request's tokens

each at a few tile sizes and warp counts (the best is printed), next to torch's copy of the
same bytes (read once, written once). Timed back to back between CUDA events, 20 launches.

    python benchmark/h200/read_speed.py [--batch 256] [--context 718]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

KV_HEADS, HEAD_DIM = 8, 128


@triton.jit
def head_kernel(k, v, out, context, TILE: tl.constexpr, DIM: tl.constexpr,
                HEADS: tl.constexpr):
    req, head = tl.program_id(0), tl.program_id(1)
    base = req * context * HEADS * DIM + head * DIM
    dims = tl.arange(0, DIM)
    acc = tl.zeros([TILE, DIM], dtype=tl.float32)
    for t0 in range(0, context, TILE):
        tokens = t0 + tl.arange(0, TILE)
        at = base + tokens[:, None] * (HEADS * DIM) + dims[None, :]
        mask = tokens[:, None] < context
        acc += tl.load(k + at, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(v + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + (req * HEADS + head) * DIM + dims, tl.sum(acc, axis=0))


@triton.jit
def row_kernel(k, v, out, context, chunk, TILE: tl.constexpr, ROW: tl.constexpr):
    req, part = tl.program_id(0), tl.program_id(1)
    base = req * context * ROW
    cols = tl.arange(0, ROW)
    acc = tl.zeros([TILE, ROW], dtype=tl.float32)
    end = tl.minimum(context, (part + 1) * chunk)
    for t0 in range(part * chunk, end, TILE):
        tokens = t0 + tl.arange(0, TILE)
        at = base + tokens[:, None] * ROW + cols[None, :]
        mask = tokens[:, None] < end
        acc += tl.load(k + at, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(v + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + (req * tl.num_programs(1) + part) * ROW + cols, tl.sum(acc, axis=0))


@triton.jit
def run_kernel(k, v, out, context, TILE: tl.constexpr, DIM: tl.constexpr,
               HEADS: tl.constexpr):
    req, head = tl.program_id(0), tl.program_id(1)
    base = (req * HEADS + head) * context * DIM
    dims = tl.arange(0, DIM)
    acc = tl.zeros([TILE, DIM], dtype=tl.float32)
    for t0 in range(0, context, TILE):
        tokens = t0 + tl.arange(0, TILE)
        at = base + tokens[:, None] * DIM + dims[None, :]
        mask = tokens[:, None] < context
        acc += tl.load(k + at, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(v + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + (req * HEADS + head) * DIM + dims, tl.sum(acc, axis=0))


def microseconds(launch, launches: int = 20) -> float:
    launch()  # compile, warm
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(launches):
            launch()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / launches)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=718)
    args = parser.parse_args()
    batch, context = args.batch, args.context
    shape = (batch * context, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    read = 2 * k.numel() * k.element_size()
    print(f"{torch.cuda.get_device_name()} · triton {triton.__version__} · batch {batch}, "
          f"context {context}: {read / 1e6:.0f} MB of K and V a layer")

    copy_to = torch.empty_like(k)
    copy_us = microseconds(lambda: (copy_to.copy_(k), copy_to.copy_(v)))
    print(f"  {'torch copy (read + write)':34s} {copy_us:9.1f} µs  "
          f"{2 * read / copy_us / 1e6:5.2f} TB/s moved  {read / copy_us / 1e6:5.2f} TB/s read")

    out = torch.empty(batch * KV_HEADS * HEAD_DIM * 64, device="cuda", dtype=torch.float32)
    rows = []
    for tile in (8, 16, 32, 64):
        for warps in (2, 4, 8):
            rows.append((f"head  tile {tile:2d} warps {warps}", microseconds(
                lambda: head_kernel[(batch, KV_HEADS)](k, v, out, context, TILE=tile,
                                                       DIM=HEAD_DIM, HEADS=KV_HEADS,
                                                       num_warps=warps))))
            rows.append((f"run   tile {tile:2d} warps {warps}", microseconds(
                lambda: run_kernel[(batch, KV_HEADS)](k, v, out, context, TILE=tile,
                                                      DIM=HEAD_DIM, HEADS=KV_HEADS,
                                                      num_warps=warps))))
        for chunk in (128, 256):
            if tile * KV_HEADS * HEAD_DIM > 16384:
                continue  # a tile of more than 32 KB of registers a load
            for warps in (4, 8):
                parts = -(-context // chunk)
                rows.append((f"row   tile {tile:2d} warps {warps} chunk {chunk}", microseconds(
                    lambda: row_kernel[(batch, parts)](k, v, out, context, chunk, TILE=tile,
                                                       ROW=KV_HEADS * HEAD_DIM,
                                                       num_warps=warps))))
    for kind in ("head", "run", "row"):
        mine = [r for r in rows if r[0].startswith(kind)]
        for name, us in sorted(mine, key=lambda r: r[1])[:3]:
            print(f"  {name:34s} {us:9.1f} µs  {read / us / 1e6:5.2f} TB/s read")


if __name__ == "__main__":
    main()
