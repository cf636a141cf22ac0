"""py-spy 采样剖析：给正在运行的服务器进程录采样，并汇总成"时间花在哪些函数里"的表。

online.py --profile DIR 在每次测量开始时，对服务器的每个进程各启动一个 `py-spy record`（pip install
py-spy；需要能 ptrace 目标进程，root 即可），测量结束时停止；每个写出 DIR/<速率>-<进程>.txt，
py-spy 的 raw 格式：每种不同的调用栈一行，帧从根到叶用 ';' 连接，行尾是采样次数。--idle 让阻塞在
系统调用里（等消息、等 GPU）的样本也算进去，于是"等待"和"干活"的比例可以直接读出来；--threads 让
每个栈以它所在的线程开头，主线程和后台线程分开统计。

    python benchmark/pyspy.py DIR/*.txt          # 每个文件、每个线程：样本数与包含时间最多的函数
    python benchmark/pyspy.py FILE --top 40

包含时间（inclusive）：栈里出现过这个函数的样本所占的比例（一个样本里同一函数出现多次只算一次），
所以调用者的比例 ≥ 被调用者的。函数按"名字 (文件名)"合并，不区分行号。几乎每个样本都有的函数
（≥ 97%，通往线程主循环的调用路径）不列出；只在等待的线程（没有别的函数）整个不列出。
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import subprocess
import sys
from pathlib import Path

RATE = 100  # samples per second: enough for shares of a few percent over a run of 10 s or more
_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(.*?) \((?:.*/)?([^/:]+)(?::\d+)?\)$")


def start(pid: int, output: Path, rate: int = RATE) -> subprocess.Popen:
    """`py-spy record` of one process until stop(); --nonblocking: the target never pauses."""
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking", "--idle",
         "--threads", "--format", "raw", "--output", str(output)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(recorders: list[subprocess.Popen]) -> list[str]:
    """Stop the recorders (SIGINT: py-spy then writes its file); their error messages."""
    for r in recorders:
        if r.poll() is None:
            r.send_signal(signal.SIGINT)
    errors = []
    for r in recorders:
        try:
            _, err = r.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            r.kill()
            _, err = r.communicate()
        if r.returncode not in (0, -signal.SIGINT) and err:
            errors.append(" | ".join(err.strip().splitlines()[:6]))
    return errors


def frame_name(frame: str) -> str:
    """'run_once (minisgl/scheduler/io.py:171)' -> 'run_once (io.py)'."""
    m = _FRAME.match(frame)
    return f"{m.group(1)} ({m.group(2)})" if m else frame


def read(path: Path) -> dict[str, collections.Counter]:
    """Per thread (the stacks' first frame), inclusive samples per function; key '' holds each
    thread's total."""
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        frames, count = m.group(1).split(";"), int(m.group(2))
        thread, names = frames[0], {frame_name(f) for f in frames[1:]}
        threads[thread][""] += count
        for name in names:
            threads[thread][name] += count
    return threads


ANCESTOR = 0.97  # a function in this share of a thread's samples or more: its call path


def summary(path: Path, top: int = 25, rate: int = RATE) -> str:
    """Per thread, the functions with the most inclusive samples; the call path leading to the
    thread's work (functions in nearly every sample) and threads that only wait are left out."""
    lines = [f"== {path.name}"]
    threads = read(path)
    for thread, counts in sorted(threads.items(), key=lambda kv: -kv[1][""]):
        total = counts[""]
        shown = [(name, n) for name, n in counts.most_common()
                 if name and n < ANCESTOR * total][:top]
        if not shown:
            continue
        lines.append(f"  {thread}: {total} 个样本（{total / rate:.1f} 秒）")
        lines += [f"    {n / total:6.1%}  {name}" for name, n in shown]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=25, help="functions shown per thread")
    args = p.parse_args(argv)
    for path in args.files:
        print(summary(path, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
