"""Host time of admitting one prefill batch of many short prompts (chapter 9's PrefillAdder).

For each waiting request, admission asks whether it shares at least DEFER_SHARED_TOKENS uncached
tokens with a request already admitted into the same batch (then it waits a step, and reads
them from the prefix cache instead). Asked of every admitted request, that is the square of the
batch; asked only of those with the same first token, it grows with the batch. This queues
--requests random prompts of --prompt tokens on a scheduler of chapter 11's tree (tiny-qwen3,
float32, radix cache, a budget and a KV pool that take them all) and times the call that admits
them, best of --rounds, each round on a new scheduler.

    python benchmark/admission_host.py [--requests 256] [--prompt 64] [--rounds 5]

Whichever minisgl is importable is timed: this tree by default, another with PYTHONPATH (the tree
before a change: `git archive REV python | tar -x -C DIR`, then PYTHONPATH=DIR/python).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if not any(Path(p, "minisgl").is_dir() for p in sys.path if p):
    sys.path.insert(0, str(ROOT / "python"))
import minisgl  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.scheduler import Scheduler, SchedulerConfig  # noqa: E402


def admit_once(model: str, requests: int, prompt: int, seed: int) -> float:
    """Seconds of host time to admit all the queued requests into one prefill batch."""
    scheduler = Scheduler(SchedulerConfig(
        model, dtype=torch.float32, device="cpu", max_running_req=requests, page_size=1,
        num_page_override=requests * (prompt + 8), max_prefill_length=requests * prompt,
        cache_type="radix"))
    rng = random.Random(seed)
    for uid in range(requests):
        scheduler.add_request(uid, [rng.randrange(100, 30000) for _ in range(prompt)],
                              SamplingParams(max_tokens=4))
    start = time.perf_counter()
    batch = scheduler.prefill.schedule_next_batch()
    spent = time.perf_counter() - start
    if batch is None or batch.size != requests:
        raise RuntimeError(f"admitted {0 if batch is None else batch.size} of {requests}")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models/tiny-qwen3"))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    best = min(admit_once(args.model, args.requests, args.prompt, seed)
               for seed in range(args.rounds))
    print(f"{Path(minisgl.__file__).parents[1]}：{args.requests} 个 {args.prompt} token "
          f"的提示词一次准入 {best * 1e3:.1f} ms（{args.rounds} 轮取最快），"
          f"每个请求 {best / args.requests * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
