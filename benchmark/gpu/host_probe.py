"""Two pieces of the host's work in the official offline workload that no step contains:
Python's garbage collector, and turning the output ids into text at the end.

One LLM, after its warm-up, runs the workload of benchmark/offline.py (256 requests, 133,966
output tokens, temperature 0.6, page_size 256) --rounds times, each round twice: as the
process is, and after gc.freeze() (every object alive then, the model's and the engine's
included, moves out of the collector's sight; later garbage is still collected). Each run
records every collection (gc.callbacks): how many per generation, their total and their
longest time. Each run adds its number to the prompts' token ids, so the radix cache finds no
prompt of an earlier run. Then the detokenization generate() ends with, timed on its own: one
tokenizer.decode per request, as generate() does, against one batch call into the Rust
tokenizer (backend_tokenizer.decode_batch) on the same ids.

    python benchmark/gpu/host_probe.py [--model models/qwen3-0.6b-random] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]
from workload_profile import official_llm  # noqa: E402


class Collections:
    """Every garbage collection while installed: (generation, seconds)."""

    def __init__(self) -> None:
        self.done: list[tuple[int, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.done.append((info["generation"], time.perf_counter() - self._start))

    def summary(self) -> str:
        parts = []
        for generation in range(3):
            times = [t for g, t in self.done if g == generation]
            parts.append(f"gen{generation} {len(times)} 次 {1e3 * sum(times):.1f} ms"
                         f"（最长 {1e3 * max(times, default=0):.2f}）")
        return "，".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    llm, prompts, params = official_llm(args.model)
    tokens = sum(p.max_tokens for p in params)
    shifts = itertools.count(1)
    outputs: list[list[int]] = []

    def run(label: str) -> None:
        shift = next(shifts)
        fresh = [[token + shift for token in prompt] for prompt in prompts]
        collections = Collections()
        gc.callbacks.append(collections)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate(fresh, params, progress=False)
        wall = time.perf_counter() - start
        gc.callbacks.remove(collections)
        outputs[:] = [o["token_ids"] for o in outs]
        print(f"{label:<14} 墙钟 {wall:.3f} s，{tokens / wall:,.0f} token/s；"
              f"{collections.summary()}", flush=True)

    print(f"gc 的阈值 {gc.get_threshold()}，启动后被跟踪的对象 {len(gc.get_objects()):,} 个")
    for _ in range(args.rounds):
        run("照常")
        gc.freeze()
        run("gc.freeze() 后")
        gc.unfreeze()

    tokenizer = llm.tokenizer
    start = time.perf_counter()
    texts = [tokenizer.decode(ids) for ids in outputs]
    each = time.perf_counter() - start
    start = time.perf_counter()
    batch = tokenizer.backend_tokenizer.decode_batch(outputs, skip_special_tokens=False)
    together = time.perf_counter() - start
    print(f"反分词 {len(outputs)} 个请求、{sum(map(len, outputs)):,} 个 token：逐个 decode "
          f"{1e3 * each:.1f} ms，Rust 一次 decode_batch {1e3 * together:.1f} ms，"
          f"文本相同 {texts == batch}")
    llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
