"""Where a process's first round of the official workload loses its time.

benchmark/offline.py builds a new LLM for every round, in one process; its first round can be
0.1-0.2 s slower than the next ones, and the official harness times only a first round. This runs the workload --rounds times as
offline.py does (a new LLM each round, the same short warm-up), with roofline.py's recorder on
the engine's launches, and splits each round's wall time: the prefill steps, the decode steps,
the idle stream before each kind of step, and the rest (before the first step and after the
last). Each round's line also counts Python's full garbage collections during its generate().
The last lines are round 1 minus the median of the later rounds, part by part; round 1's steps
that lost the most against the same steps of round 2; and each prefill step of both.

    python benchmark/gpu/first_round.py [--model models/qwen3-0.6b-random] [--rounds 3]
        [--also-warm-up 16415]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark"), str(ROOT / "benchmark/gpu")]
from roofline import Recording, record  # noqa: E402
from workload_profile import official_llm  # noqa: E402

PARTS = ("wall", "prefill", "decode", "idle prefill", "idle decode", "outside")


def parts(rec: Recording) -> dict[str, float]:
    """A round's wall time split into PARTS (seconds)."""
    idle = rec.idle_before or [0.0] * len(rec.steps)
    split = {name: 0.0 for name in PARTS}
    for step, seconds, before in zip(rec.steps, rec.seconds, idle):
        split[step.phase] += seconds
        split[f"idle {step.phase}"] += before
    split["wall"] = rec.wall_seconds
    split["outside"] = rec.wall_seconds - sum(rec.seconds) - sum(idle)
    return split


class FullCollections:
    """Python's full (generation 2) garbage collections while installed in gc.callbacks: when
    each started (perf_counter) and how long it took. The first one in a process walks every
    object the imports, the model and the graphs made."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 2:
            now = time.perf_counter()
            if phase == "start":
                self._start = now
            else:
                self.spans.append((self._start, now - self._start))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--also-warm-up", type=int, metavar="TOKENS",
                        help="after the LLM is built, one more warm-up prefill of this many tokens "
                             "(Engine.warm_up): is a later first-time step a new row count?")
    args = parser.parse_args()
    rounds: list[Recording] = []
    for i in range(args.rounds):
        start = time.perf_counter()
        llm, prompts, params = official_llm(args.model)
        if args.also_warm_up:
            llm.backend.scheduler.engine.warm_up(args.also_warm_up)  # type: ignore[union-attr]
        built = time.perf_counter() - start
        collections = FullCollections()
        gc.callbacks.append(collections)
        started = time.perf_counter()
        try:
            rounds.append(record(llm, prompts, params))
        finally:
            gc.callbacks.remove(collections)
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        split = parts(rounds[-1])
        gcs = "".join(f", {1e3 * took:.1f} ms at {at - started:.2f} s"
                      for at, took in collections.spans)
        print(f"round {i + 1}: LLM built and warmed up in {built:.1f} s; "
              + ", ".join(f"{name} {1e3 * split[name]:.1f}" for name in PARTS) + " (ms); "
              f"full garbage collections: {len(collections.spans)}{gcs}", flush=True)
    if len(rounds) < 2:
        return 0
    later = [parts(r) for r in rounds[1:]]
    first = parts(rounds[0])
    print("round 1 minus the median of the later rounds (ms): " + ", ".join(
        f"{name} {1e3 * (first[name] - statistics.median(p[name] for p in later)):+.1f}"
        for name in PARTS))
    one, two = rounds[0], rounds[1]
    # Step by step, round 1's extra time (its step and the idle stream before it) over round 2's
    # same step: the workload is the same, so the steps correspond one to one.
    extra = sorted(((sa + ia) - (sb + ib), i) for i, (sa, ia, sb, ib) in enumerate(zip(
        one.seconds, one.idle_before or [], two.seconds, two.idle_before or [])))
    print("round 1's steps that took longest over round 2's (step: phase requests, ms + idle "
          "before, ms; round 2's):")
    for _, i in extra[::-1][:8]:
        print(f"  {i:>4}: {one.steps[i].phase} {one.steps[i].requests:>3}, "
              f"{1e3 * one.seconds[i]:6.1f} + {1e3 * (one.idle_before or [])[i]:6.1f}; "
              f"{1e3 * two.seconds[i]:6.1f} + {1e3 * (two.idle_before or [])[i]:6.1f}")
    print("prefill steps, round 1 against round 2 (tokens: ms + idle before, ms):")
    for a, sa, ia, b, ib in zip(one.steps, one.seconds, one.idle_before or [], two.seconds,
                                two.idle_before or []):
        if a.phase == "prefill":
            print(f"  {a.new_tokens:>6}: {1e3 * sa:6.1f} + {1e3 * ia:5.1f}   "
                  f"{1e3 * b:6.1f} + {1e3 * ib:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
