"""Where the official offline workload's time goes, on the host and on the GPU.

The workload of benchmark/offline.py (256 requests, 133,966 output tokens, temperature 0.6,
page_size 256), run by one LLM after its warm-up, several times:
1. plain: the wall time;
2. under py-spy (--idle, the main thread): which functions the host spends the run in, waiting
   for the GPU included; then the same for five runs of the prefill alone (below);
3. under torch.profiler, GPU activity only: every kernel's time summed by category (the
   categories of decode_profile.py), the time the GPU is busy at all (the union of the
   kernels' intervals) against the wall time, and its idle gaps by their length;
4. the same for the prefill alone: the same prompts with max_tokens 1.
Every run adds its number to each prompt's token ids (the ids stay below the vocabulary): the
lengths are the workload's, and the radix cache finds no prompt of an earlier run.

--requests N keeps the workload's first N requests: a run of small decode batches, where the
host's work per step, not the GPU, may set the pace.

    python benchmark/gpu/workload_profile.py [--model models/qwen3-0.6b-random] [--out DIR]
                                              [--requests N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]
from decode_profile import category  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from offline import official_workload  # noqa: E402
from timeline import merge, total  # noqa: E402
import pyspy  # noqa: E402


def official_llm(model: str, requests: int | None = None
                 ) -> tuple[LLM, list[list[int]], list[SamplingParams]]:
    """An LLM set up as benchmark/offline.py runs the official workload, warmed up, with the
    workload's (first `requests`) prompts and sampling parameters."""
    prompts, output_lens = official_workload()
    prompts, output_lens = prompts[:requests], output_lens[:requests]
    llm = LLM(model, dtype=torch.bfloat16, max_running_req=len(prompts), page_size=256,
              max_seq_len_override=4096, max_prefill_length=16384, device="cuda")
    llm.generate([prompts[0][:50]], SamplingParams(max_tokens=4, ignore_eos=True),
                 progress=False)
    return llm, prompts, [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.6)
                          for n in output_lens]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--out", default=".", help="where py-spy's raw stacks go")
    parser.add_argument("--requests", type=int, default=None, help="the first N requests only")
    args = parser.parse_args()
    llm, prompts, params = official_llm(args.model, args.requests)
    once = [SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.6)] * len(prompts)
    runs = itertools.count(1)

    def run(prefill_only: bool = False) -> float:
        shift = next(runs)
        fresh = [[token + shift for token in prompt] for prompt in prompts]
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(fresh, once if prefill_only else params, progress=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    print(f"plain: {run():.2f} s wall", flush=True)
    # The prefill alone is under half a second: five runs, sampled five times as often.
    for name, runs_spied, rate in (("workload", 1, pyspy.RATE), ("prefill", 5, 5 * pyspy.RATE)):
        stacks = Path(args.out) / f"{name}.pyspy.txt"
        recorder = pyspy.start(os.getpid(), stacks, rate)
        time.sleep(1)  # py-spy attaches
        walls = [run(prefill_only=name == "prefill") for _ in range(runs_spied)]
        print(f"{name} under py-spy: {' '.join(f'{w:.2f}' for w in walls)} s wall", flush=True)
        for error in pyspy.stop([recorder]):
            print("py-spy:", error)
        if stacks.is_file():
            print(pyspy.summary(stacks, top=45, rate=rate), flush=True)
    for title, prefill_only in (("the workload", False), ("its prefill alone", True)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall = run(prefill_only)
        print(f"== {title}")
        report(prof, wall)
    llm.shutdown()
    return 0


def report(prof: profile, wall: float) -> None:
    """GPU time by category and by kernel, the GPU's busy time, its idle gaps by length."""
    by_category: Counter[str] = Counter()
    by_kernel: Counter[str] = Counter()
    intervals = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            seconds = event.time_range.elapsed_us() / 1e6
            by_category[category(event.name)] += seconds
            by_kernel[event.name] += seconds
            intervals.append((event.time_range.start, event.time_range.end))
    merged = merge(intervals)
    busy = total(merged) / 1e6  # seconds
    print(f"under the profiler (GPU only): {wall:.2f} s wall, GPU busy {busy:.2f} s "
          f"({busy / wall:.1%}), kernel time {sum(by_category.values()):.2f} s in "
          f"{len(intervals):,} kernels")
    # The GPU's idle time between its first and last kernel, by the length of each gap: many
    # short ones are kernel boundaries, gaps of a step's length are the host.
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    print("idle gaps between kernels (count, total s):")
    for low, high in ((0, 5), (5, 50), (50, 500), (500, 5000), (5000, float("inf"))):
        within = [g for g in gaps if low <= g < high]
        print(f"  {low:>5}-{high:<5} us  {len(within):>9,}  {sum(within) / 1e6:7.3f} s")
    for name, seconds in by_category.most_common():
        print(f"  {seconds:7.3f} s  {name}")
    print("kernels with the most GPU time (s):")
    for name, seconds in by_kernel.most_common(30):
        print(f"  {seconds:7.3f}  {name[:120]}")


if __name__ == "__main__":
    sys.exit(main())
