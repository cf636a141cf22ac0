"""Where an eager prefill step's host time goes, op by op.

In the server a prefill step costs 16-22 ms on the H200's hosts, and decoding requests wait for
it (chapter 15). Its GPU work for 8,192 tokens of Qwen3-0.6B is far less than that. This runs
one such step in LLM.generate (8 prompts of 1,024 random tokens, max_tokens 1: one prefill
step, no decode) three times for its wall time, then once under torch.profiler, and lists the
host (self CPU) time by op, next to the device total.

    python benchmark/gpu/prefill_host.py [--model models/qwen3-0.6b-random]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


def prompts(seed: int, count: int = 8, length: int = 1024) -> list[list[int]]:
    rng = random.Random(seed)  # a new seed per call: no prefix of an earlier call to hit
    return [[rng.randrange(1000, 30000) for _ in range(length)] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--device", default="cuda", help="cpu only to try the script itself")
    args = parser.parse_args()
    gpu = args.device == "cuda"
    llm = LLM(args.model, dtype=torch.bfloat16 if gpu else torch.float32, device=args.device,
              cuda_graph="off")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    one_step = SamplingParams(max_tokens=1, ignore_eos=True)
    try:
        llm.generate(prompts(0), one_step, progress=False)  # JIT, cuBLAS's choice per shape
        for seed in (1, 2, 3):
            sync()
            start = time.perf_counter()
            llm.generate(prompts(seed), one_step, progress=False)
            sync()
            print(f"one 8,192-token prefill step in LLM.generate: "
                  f"{(time.perf_counter() - start) * 1e3:.1f} ms wall", flush=True)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if gpu else [])
        with torch.profiler.profile(activities=activities) as prof:
            llm.generate(prompts(9), one_step, progress=False)
            sync()
        events = prof.key_averages()
        host = sum(e.self_cpu_time_total for e in events) / 1e3
        device = sum(e.self_device_time_total for e in events) / 1e3
        print(f"under the profiler: host (self CPU, all ops) {host:.1f} ms, "
              f"device {device:.1f} ms", flush=True)
        print(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
