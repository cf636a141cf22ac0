"""FlashInfer's paged decode attention with and without its tensor-core path, side by side.

Chapter 17's backend turns the tensor-core path on only when at least 4 query heads share a KV
head; Qwen3-0.6B has 2 (16 query heads, 8 KV heads), so its decode runs the CUDA-core kernel.
At batch 256 that kernel is about 1.25x the time its K and V take to read (chapter 21). This
measures both paths on the model's shapes, so the threshold is a measurement, not a guess.

    python benchmark/gpu/decode_attention.py [--batch 64 128 256] [--context 512 1024]
    python benchmark/gpu/decode_attention.py --graph --batch 1 2 4 8 --page-size 16

One layer's decode attention, eager calls between CUDA events (each call is 50 µs or more at
these sizes, so the host stays ahead of the GPU), best of 5 rounds of 20 calls; GB/s counts the
K and V bytes the batch must read once.

--graph measures small batches as the engine replays them, 50 calls captured in one graph:
FlashInfer's CUDA-graph wrapper (which always splits each request's KV into chunks of at least
128 tokens, then merges the chunks' partial results in a second kernel), with and without its
tensor-core path, and chapter 19's own kernel (csrc/decode_attention.cu: a block per KV head
and chunk, chunks merged by the last one to finish, the new token's K/V store included), its
plan made as the backend makes it (a wave of chunks, or two) with chunks of at least each
--min-chunk tokens, captured the same way.

--mixed measures contexts of different lengths, the official workload's at the first decode
step (its prompts: 100-1,024 tokens) and further on (each request 300 and 600 tokens further),
as the engine replays them at page size 256: FlashInfer's CUDA-graph wrapper planned for those
lengths, and ours; and our plan kernel itself (once a step, not a layer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]
from minisgl.benchmark.perf import best_microseconds  # noqa: E402
from offline import official_workload  # noqa: E402

KV_HEADS, HEAD_DIM = 8, 128  # Qwen3-0.6B and Qwen3-8B alike; 16 query heads or 32 (--query-heads)


def kv_bytes(contexts: list[int]) -> int:
    """The K and V bytes a decode step of these requests must read once (bfloat16)."""
    return sum(contexts) * KV_HEADS * HEAD_DIM * 2 * 2


def decode_microseconds(contexts: list[int], page_size: int, tensor_cores: bool,
                        q_heads: int, graph: bool = False) -> float:
    import flashinfer

    batch, dtype, device = len(contexts), torch.bfloat16, "cuda"
    pages = [-(-c // page_size) for c in contexts]
    num_pages = sum(pages)
    k = torch.randn(num_pages, page_size, KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    v = torch.randn_like(k)
    q = torch.randn(batch, q_heads, HEAD_DIM, dtype=dtype, device=device)
    indptr = torch.tensor([0, *pages], dtype=torch.int32, device=device).cumsum(0).int()
    indices = torch.randperm(num_pages, dtype=torch.int32, device=device)  # scattered pages
    last_page_len = torch.tensor([c - (n - 1) * page_size for c, n in zip(contexts, pages)],
                                 dtype=torch.int32, device=device)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
    if graph:
        wrapper = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            workspace, indptr, indices, last_page_len, "NHD", use_tensor_cores=tensor_cores)
    else:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                use_tensor_cores=tensor_cores)
    wrapper.plan(indptr, indices, last_page_len, q_heads, KV_HEADS, HEAD_DIM, page_size,
                 q_data_type=dtype, kv_data_type=dtype)
    return best_microseconds(lambda: wrapper.run(q, (k, v)), iters=50 if graph else 20,
                             rounds=5, graph=graph)


def ours_microseconds(contexts: list[int], page_size: int, q_heads: int,
                      min_chunk: int) -> tuple[float, float]:
    """Chapter 19's kernel on the same shapes, the pages scattered the same way; it also stores
    the new token's K and V (a launch of store_kv before FlashInfer's, in the engine). Returns
    the attention's time and the plan's."""
    from minisgl.kernel import cuda_kernels

    batch, dtype, device = len(contexts), torch.bfloat16, "cuda"
    pages_per_req = -(-max(contexts) // page_size)  # the page table's width
    slots = batch * pages_per_req * page_size
    k_cache = torch.randn(slots, KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    pages = torch.randperm(batch * pages_per_req, device=device).view(batch, pages_per_req)
    offsets = torch.arange(page_size, device=device)
    page_table = (pages[:, :, None] * page_size + offsets).view(batch, -1).int()
    rows = torch.arange(batch, device=device)
    positions = torch.tensor(contexts, device=device) - 1
    out_loc = page_table[rows, positions].long()
    qkv = torch.randn(batch, (q_heads + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype, device=device)
    q, k, v = (part.view(batch, -1, HEAD_DIM) for part in qkv.split(
        [q_heads * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1))
    items = cuda_kernels.decode_attention_items_per_wave(q_heads, KV_HEADS, HEAD_DIM, dtype,
                                                         torch.device(device))
    scratch = cuda_kernels.decode_attention_scratch(batch, items, q_heads, KV_HEADS, HEAD_DIM,
                                                    device)
    plan = best_microseconds(lambda: cuda_kernels.decode_attention_plan(
        positions, items, scratch, min_chunk), iters=50, rounds=5)
    attention = best_microseconds(lambda: cuda_kernels.decode_attention(
        q, k, v, k_cache, v_cache, page_table, rows, positions, out_loc, HEAD_DIM ** -0.5,
        items, scratch), iters=50, rounds=5)
    return attention, plan


def small_batch_table(batches: list[int], contexts: list[int], page_sizes: list[int],
                      min_chunks: list[int], q_heads: int) -> None:
    """Also GB/s (K and V bytes read once) of FlashInfer's CUDA-core kernel and of our best."""
    print(f"{'batch':>6} {'context':>8} {'page':>5} {'CUDA cores µs':>14} "
          f"{'tensor cores µs':>16}" + "".join(f" {f'ours ≥{m} µs':>12}" for m in min_chunks)
          + f" {'GB/s CUDA cores':>16} {'GB/s ours':>10}")
    for page_size in page_sizes:
        for context in contexts:
            for batch in batches:
                kv = kv_bytes([context] * batch)
                times = [decode_microseconds([context] * batch, page_size, tensor_cores,
                                             q_heads, graph=True) for tensor_cores in (False, True)]
                times += [ours_microseconds([context] * batch, page_size, q_heads, m)[0]
                          for m in min_chunks]
                print(f"{batch:>6} {context:>8} {page_size:>5} {times[0]:>14.1f} "
                      f"{times[1]:>16.1f}" + "".join(f" {t:>12.1f}" for t in times[2:])
                      + f" {kv / times[0] / 1e3:>16.0f}"
                      f" {kv / min(times[2:]) / 1e3:>10.0f}", flush=True)


def mixed_table(batches: list[int], min_chunk: int, q_heads: int) -> None:
    """The official workload's contexts: FlashInfer's graph wrapper and ours, page size 256;
    GB/s of each, and our plan's time."""
    prompts = [len(p) for p in official_workload()[0]]
    print(f"{'batch':>6} {'step':>5} {'tokens':>7} {'FlashInfer µs':>14} {'ours µs':>8}"
          f" {'plan µs':>8} {'GB/s FlashInfer':>16} {'GB/s ours':>10}")
    for batch in batches:
        for step, extra in (("first", 0), ("+300", 300), ("+600", 600)):
            contexts = [n + extra for n in prompts[:batch]]
            flashinfer = decode_microseconds(contexts, 256, False, q_heads, graph=True)
            ours, plan = ours_microseconds(contexts, 256, q_heads, min_chunk)
            kv = kv_bytes(contexts)
            print(f"{batch:>6} {step:>5} {sum(contexts):>7} {flashinfer:>14.1f} {ours:>8.1f}"
                  f" {plan:>8.1f} {kv / flashinfer / 1e3:>16.0f} {kv / ours / 1e3:>10.0f}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--context", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--page-size", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--graph", action="store_true",
                        help="as the engine replays decode: the CUDA-graph wrapper, in a graph")
    parser.add_argument("--min-chunk", type=int, nargs="+", default=[64],
                        help="our kernel's plan: tokens a chunk holds at least (--mixed: the "
                        "first)")
    parser.add_argument("--mixed", action="store_true",
                        help="the official workload's different context lengths (see above)")
    parser.add_argument("--query-heads", type=int, default=16,
                        help="16 (Qwen3-0.6B: 2 a KV head) or 32 (Qwen3-8B: 4 a KV head)")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; one layer of decode "
          f"attention, {args.query_heads} query heads, {KV_HEADS} KV heads, head_dim {HEAD_DIM}, "
          "bf16")
    if args.mixed:
        mixed_table(args.batch, args.min_chunk[0], args.query_heads)
        return
    if args.graph:
        small_batch_table(args.batch, args.context, args.page_size, args.min_chunk,
                          args.query_heads)
        return
    print(f"{'batch':>6} {'context':>8} {'page':>5} {'KV MB':>7} {'CUDA cores µs':>14} "
          f"{'GB/s':>6} {'tensor cores µs':>16} {'GB/s':>6} {'ratio':>6}")
    for page_size in args.page_size:
        for context in args.context:
            for batch in args.batch:
                kv = kv_bytes([context] * batch)
                plain, cores = (decode_microseconds([context] * batch, page_size, tensor_cores,
                                                    args.query_heads)
                                for tensor_cores in (False, True))
                print(f"{batch:>6} {context:>8} {page_size:>5} {kv / 1e6:>7.1f} "
                      f"{plain:>14.1f} {kv / plain / 1e3:>6.0f} {cores:>16.1f} "
                      f"{kv / cores / 1e3:>6.0f} {plain / cores:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
