"""一个 decode 步的时间花在哪：batch 256，每个注意力后端各测一次，同一次运行里并排（GPU）。

256 个请求（随机提示词 --prompt-len 个 token）全部 prefill 完之后，调度器每一步都是 256 个
请求的 decode。先跑几步热身，再跑 --steps 步量墙钟，然后用 torch.profiler（只记 GPU）再记 --steps 步：
- 墙钟：每步的主机时间（步与步之间不同步，测的是稳态；不开 profiler）；
- GPU：每步 kernel 时间之和，按类别分开（采样、注意力、矩阵乘、norm/RoPE/激活、KV 写入/gather、其余）；
- GPU 跨度：从这几步的第一个 kernel 开始到最后一个结束，每步多长；跨度减去 GPU 忙（kernel
  区间的并集）就是 GPU 空着的时间，其中长于 10 微秒的空档单独算（主机没跟上；图里相邻 kernel
  之间的空档只有一两微秒）；
- 每步发射的 kernel 个数。
GPU 时间远小于墙钟时，步长由主机（Python 发射 kernel、准备元数据）决定。--temperature 大于 0
时按温度采样（官方负载用 0.6），默认贪心；--page-size 默认 16（官方负载用 256）；--cuda-graph off
让每一步都 eager 地跑（第 18 章之前的样子）。

    python benchmark/decode_profile.py --model models/qwen3-0.6b-random --attn torch flashinfer
    python benchmark/decode_profile.py --attn flashinfer --prompt-len 1024 --temperature 0.6 \\
        --page-size 256 --custom-kernels auto off --top 30
    python benchmark/decode_profile.py --attn torch flashinfer --cuda-graph off --custom-kernels off
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler
from report import columns, pad
from timeline import merge, total

CATEGORIES = [  # first match wins; FlashInfer's norm, RoPE and activation kernels are not attention
    # the sampler: chapter 19's kernel, or the reference's argmax, softmax over the vocabulary
    # (cunn_SoftMax: rows longer than 1,024) and multinomial's exponential draws
    ("采样", re.compile(r"sample_(span_|merge_)?kernel|ArgMax|cunn_SoftMax|distribution_", re.I)),
    ("注意力", re.compile(r"BatchDecode|BatchPrefill|MergeStates|fmha|flash_fwd|attention|softmax"
                        r"|sdpa", re.I)),
    ("矩阵乘", re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|matmul", re.I)),
    ("norm/RoPE/激活", re.compile(r"norm|rotary|rope|act_and_mul|silu", re.I)),
    ("KV 写入/gather", re.compile(r"index|gather|scatter|store_kv", re.I)),
]


def category(name: str) -> str:
    return next((label for label, pattern in CATEGORIES if pattern.search(name)), "其余")


def long_gaps(busy: list[tuple[float, float]], longer_than: float) -> float:
    """Idle time between sorted, disjoint busy intervals, counting only the longer gaps."""
    gaps = (start - end for (_, end), (start, _) in zip(busy, busy[1:]))
    return sum(gap for gap in gaps if gap > longer_than)


def decoding(scheduler: Scheduler) -> bool:
    """Whether every request is prefilled and the step in flight is a decode step."""
    flight = scheduler.in_flight
    return flight is not None and flight.batch.is_decode and not scheduler.prefill.runnable


def profile_backend(model: str, attn: str, batch: int, prompt_len: int, steps: int,
                    custom_kernels: str = "auto", temperature: float = 0.0,
                    page_size: int = 16, cuda_graph: str = "auto") -> dict:
    llm = LLM(model, dtype=torch.bfloat16, attention_backend=attn, max_running_req=batch,
              page_size=page_size, max_seq_len_override=prompt_len + 512, device="cuda",
              custom_kernels=custom_kernels, cuda_graph=cuda_graph)
    scheduler = llm.backend.scheduler  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(0)
    for uid in range(batch):
        scheduler.add_request(uid, torch.randint(0, 10000, (prompt_len,), generator=gen),
                              SamplingParams(max_tokens=400, ignore_eos=True,
                                             temperature=temperature))
    while not decoding(scheduler):  # prefill everything
        scheduler.step()
    for _ in range(5):  # warm-up decode steps
        scheduler.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        scheduler.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sizes = []
        for _ in range(steps):
            sizes.append(scheduler.in_flight.batch.size)  # type: ignore[union-attr]
            scheduler.step()
        torch.cuda.synchronize()
    gpu: Counter[str] = Counter()
    kernels: Counter[str] = Counter()  # GPU ms per step of each kernel name
    intervals = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            gpu[category(event.name)] += event.time_range.elapsed_us() / 1000 / steps
            kernels[event.name] += event.time_range.elapsed_us() / 1000 / steps
            intervals.append((event.time_range.start, event.time_range.end))
    busy = merge(intervals)  # microseconds
    span = (busy[-1][1] - busy[0][0]) / 1e3
    del scheduler  # the engine and its KV pool must go with the LLM
    llm.shutdown()
    gc.collect()
    torch.cuda.empty_cache()  # the next backend's pool is sized from free memory
    return {"wall": wall * 1000, "gpu": gpu, "kernels": kernels,
            "launches": len(intervals) / steps, "batch": sum(sizes) / len(sizes),
            "span": span / steps, "busy": total(busy) / 1e3 / steps,
            "long_gaps": long_gaps(busy, 10.0) / 1e3 / steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--attn", nargs="+", default=["torch", "flashinfer"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--custom-kernels", nargs="+", default=["auto"],
                        choices=["auto", "off"], help="chapter 19's kernels, each a row")
    parser.add_argument("--cuda-graph", default="auto", choices=["auto", "off"],
                        help="chapter 18's decode graphs (off: every step eager)")
    parser.add_argument("--top", type=int, default=0,
                        help="also list the N kernels that take the most GPU time per step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("需要 CUDA GPU")
        return 1
    results = {}
    for attn in args.attn:
        for mode in args.custom_kernels:
            name = f"--attn {attn}" + (f" 自写kernel {mode}" if len(args.custom_kernels) > 1 else "")
            results[name] = profile_backend(args.model, attn, args.batch, args.prompt_len,
                                            args.steps, mode, args.temperature, args.page_size,
                                            args.cuda_graph)
    sampling = f"温度 {args.temperature:g} 采样" if args.temperature > 0 else "贪心"
    eager = "，不录图" if args.cuda_graph == "off" else ""
    print(f"decode 一步，batch {args.batch}，每个请求约 {args.prompt_len} 个 token 的上下文，"
          f"page_size {args.page_size}，{sampling}{eager}，bfloat16，"
          f"{torch.cuda.get_device_name()}（{args.steps} 步的平均，毫秒）")
    labels = [label for label, _ in CATEGORIES] + ["其余"]
    header = ["", "batch", "墙钟/步", "GPU 跨度", "GPU 忙", "长空档", "GPU 合计", *labels,
              "kernel 数/步"]
    width = max(18, *(columns(name) + 2 for name in results))
    print("  " + "".join(pad(h, width if i == 0 else 16) for i, h in enumerate(header)))
    for name, r in results.items():
        cells = [name, f"{r['batch']:.0f}", f"{r['wall']:.2f}", f"{r['span']:.2f}",
                 f"{r['busy']:.2f}", f"{r['long_gaps']:.2f}", f"{sum(r['gpu'].values()):.2f}",
                 *(f"{r['gpu'][label]:.2f}" for label in labels), f"{r['launches']:.0f}"]
        print("  " + "".join(pad(c, width if i == 0 else 16) for i, c in enumerate(cells)))
    for name, r in results.items() if args.top else ():
        print(f"{name}：GPU 时间最多的 {args.top} 个 kernel（GPU 毫秒/步）")
        for kernel, ms in r["kernels"].most_common(args.top):
            print(f"  {ms:7.3f}  {kernel[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
