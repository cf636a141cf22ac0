"""How fast can a kernel read a decode step's keys and values on this GPU?

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
same bytes (read once, written once). Each is the best of 3 x 20 launches back to back
between CUDA events (minisgl/benchmark/perf.py, eager).

    python benchmark/gpu/read_speed.py [--batch 256] [--context 718]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from minisgl.benchmark.perf import best_microseconds  # noqa: E402

KV_HEADS, HEAD_DIM = 8, 128
# A (request, KV head) block's (request, head, token) strides in the two pool orders.
ORDERS = {"head": lambda context: (context * KV_HEADS * HEAD_DIM, HEAD_DIM, KV_HEADS * HEAD_DIM),
          "run": lambda context: (KV_HEADS * context * HEAD_DIM, context * HEAD_DIM, HEAD_DIM)}


@triton.jit
def head_kernel(k, v, out, context, req_stride, head_stride, token_stride, TILE: tl.constexpr,
                DIM: tl.constexpr, HEADS: tl.constexpr):
    # One block a (request, KV head); the strides give the pool's order (ORDERS).
    req, head = tl.program_id(0), tl.program_id(1)
    base = req * req_stride + head * head_stride
    dims = tl.arange(0, DIM)
    acc = tl.zeros([TILE, DIM], dtype=tl.float32)
    for t0 in range(0, context, TILE):
        tokens = t0 + tl.arange(0, TILE)
        at = base + tokens[:, None] * token_stride + dims[None, :]
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


def eager_microseconds(launch: Callable[[], object]) -> float:
    # Eager: each of these launches takes longer on the GPU than on the host.
    return best_microseconds(launch, iters=20, rounds=3, graph=False)


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
    copy_us = eager_microseconds(lambda: (copy_to.copy_(k), copy_to.copy_(v)))
    print(f"  {'torch copy (read + write)':34s} {copy_us:9.1f} µs  "
          f"{2 * read / copy_us / 1e6:5.2f} TB/s moved  {read / copy_us / 1e6:5.2f} TB/s read")

    out = torch.empty(batch * KV_HEADS * HEAD_DIM * 64, device="cuda", dtype=torch.float32)
    rows = []
    for tile in (8, 16, 32, 64):
        for warps in (2, 4, 8):
            for kind, strides in ORDERS.items():
                rows.append((f"{kind:5s} tile {tile:2d} warps {warps}", eager_microseconds(
                    lambda: head_kernel[(batch, KV_HEADS)](
                        k, v, out, context, *strides(context), TILE=tile, DIM=HEAD_DIM,
                        HEADS=KV_HEADS, num_warps=warps))))
        for chunk in (128, 256):
            if tile * KV_HEADS * HEAD_DIM > 16384:
                continue  # a tile of more than 32 KB of registers a load
            for warps in (4, 8):
                parts = -(-context // chunk)
                name = f"row   tile {tile:2d} warps {warps} chunk {chunk}"
                rows.append((name, eager_microseconds(
                    lambda: row_kernel[(batch, parts)](k, v, out, context, chunk, TILE=tile,
                                                       ROW=KV_HEADS * HEAD_DIM,
                                                       num_warps=warps))))
    for kind in ("head", "run", "row"):
        mine = [r for r in rows if r[0].startswith(kind)]
        for name, us in sorted(mine, key=lambda r: r[1])[:3]:
            print(f"  {name:34s} {us:9.1f} µs  {read / us / 1e6:5.2f} TB/s read")


if __name__ == "__main__":
    main()
