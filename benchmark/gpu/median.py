"""The median over fresh processes of one measurement, for benchmark/gpu/run.sh's records.

    python benchmark/gpu/median.py offline A.json B.json C.json   # offline.py --json, one each
    python benchmark/gpu/median.py serving A.json B.json C.json   # online.py --json, one each
    python benchmark/gpu/median.py decode RECORD.txt              # tp_decode.py's "measured:"

offline: each process's output tokens/s per row, and the median per row.
serving: the serving floors (online.py's 下限 section) per process, and the median of each:
streamed throughput at each rate against LLM.generate on the same requests (at least 80%),
ITL p50 against the engine's decode step (at most 2x), TTFT p50 at 16 req/s (at most 150 ms).
decode: each setting's ms/step per process, and the median per setting and batch.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark/: online.py's floors
from online import MAX_ITL_STEPS, MAX_TTFT_MS, MIN_ONLINE_SHARE  # noqa: E402


def offline(paths: list[str]) -> list[str]:
    rows: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        for row in json.loads(Path(path).read_text(encoding="utf-8"))["rows"]:
            rows[row["name"]].append(row["output_tokens_per_s"])
    return [f"  {name}：{' / '.join(f'{v:,.1f}' for v in values)} 输出 token/s，"
            f"{len(values)} 个进程的中位数 {statistics.median(values):,.1f}"
            for name, values in rows.items()]


def serving(paths: list[str]) -> list[str]:
    measures: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        offline_by_round = {o["round"]: o for o in report["offline"]}
        for run in report["runs"]:
            o = offline_by_round.get(run["round"])
            if not run["completed"]:
                continue
            label = run["label"]
            if o:
                measures[f"{label}：在线 / 离线 输出 token/s（≥ {MIN_ONLINE_SHARE:.0%}）"].append(
                    run["output_throughput"] / o["output_throughput"])
                if o.get("decode_ms") and run["itl_ms"]["p50"] is not None:
                    measures[f"{label}：ITL p50 / 引擎 decode 一步（≤ {MAX_ITL_STEPS:g} 倍）"].append(
                        run["itl_ms"]["p50"] / o["decode_ms"])
            if run["rate"] == 16.0 and run["ttft_ms"]["p50"] is not None:
                measures[f"{label}：TTFT p50 ms（≤ {MAX_TTFT_MS:.0f}）"].append(run["ttft_ms"]["p50"])
    lines = []
    for name, values in measures.items():
        fmt = ((lambda v: f"{v:.0%}") if "%" in name else
               (lambda v: f"{v:.0f}") if "ms" in name else (lambda v: f"{v:.2f}"))
        lines.append(f"  {name}：{' / '.join(map(fmt, values))}，"
                     f"{len(values)} 次的中位数 {fmt(statistics.median(values))}")
    return lines


MEASURED = re.compile(r"^measured: (.+ batch \d+): ([\d.]+) ms/step")


def decode(paths: list[str]) -> list[str]:
    settings: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if m := MEASURED.match(line):
                settings[m[1]].append(float(m[2]))
    return [f"  {name}：{' / '.join(f'{v:.2f}' for v in values)} ms/step，"
            f"{len(values)} 个进程的中位数 {statistics.median(values):.2f}"
            for name, values in settings.items()]


def main(argv: list[str]) -> int:
    kinds = {"offline": offline, "serving": serving, "decode": decode}
    if len(argv) < 2 or argv[0] not in kinds:
        print(f"usage: median.py {{{','.join(kinds)}}} FILE [FILE ...]", file=sys.stderr)
        return 2
    present = [p for p in argv[1:] if Path(p).is_file()]
    print(f"# 中位数（{len(present)} 个结果，{len(argv) - 1 - len(present)} 个缺失）：")
    print("\n".join(kinds[argv[0]](present)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
