"""CPU that starting child processes costs: forkserver (what minisgl.utils.process uses) against
spawn (what the official mini-sglang uses). Linux only (reads /proc, uses a child subreaper).

Two measurements, each side in a fresh launcher process:

  child  start `--children` children one after another; each reports the CPU seconds it spent
         before its target ran (its own rusage) and the launcher times start -> ready report.
         With forkserver, the forkserver's own CPU (its imports, paid once) is read from /proc.
  tree   `LLM(tp_size=2)` on a tiny model: start, generate, shut down. The CPU of the whole
         process tree (launcher, ranks, forkserver, resource tracker), collected as rusage of
         reaped descendants: this process is a child subreaper, so orphans come back to it.

    python benchmark/start_cpu.py --children 3 --rounds 2
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def report_start_up(*, status) -> None:
    """A child's target: the CPU seconds this process used before it ran."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    status.ready(usage.ru_utime + usage.ru_stime)


def _use(method: str) -> None:
    """Make minisgl.utils.process start its children with `method`."""
    import multiprocessing as mp

    from minisgl.utils import process
    if method != "forkserver":
        process._CTX = mp.get_context(method)


def child_launcher(method: str, children: int) -> None:
    """One launcher: start `children` children in turn; print one line per child."""
    _use(method)
    from process_cpu import _children, cpu_seconds

    from minisgl.utils.process import Children
    started = Children()
    for i in range(children):
        start = time.monotonic()
        started.start("start_cpu:report_start_up", f"child{i}")  # benchmark/ is on sys.path
        cpu = started.wait_ready(timeout=120)[f"child{i}"]
        print(f"  子进程 {i + 1}：运行目标之前 CPU {cpu:.2f} 秒，从启动到报告就绪 "
              f"{time.monotonic() - start:.2f} 秒",
              flush=True)
    servers = [pid for _, pid, cmd in _children(os.getpid())
               if b"multiprocessing.forkserver" in cmd]
    for pid in servers:
        print(f"  forkserver 自己：CPU {cpu_seconds(pid):.2f} 秒（预加载的 import，只做一次）",
              flush=True)
    started.stop()


def tree_launcher(method: str, model: str) -> None:
    """One launcher: LLM(tp_size=2) start, generate, shutdown."""
    _use(method)
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    llm = LLM(model, tp_size=2, max_running_req=4, num_page_override=256,
              max_seq_len_override=128)
    try:
        llm.generate(["The capital of France is", "Hello"],
                     SamplingParams(max_tokens=16, ignore_eos=True))
    finally:
        llm.shutdown()


def _become_subreaper() -> None:
    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap_all() -> None:
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def tree_cpu(method: str, model: str) -> tuple[float, float]:
    """(CPU seconds of the whole tree, wall seconds) of one tree_launcher run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    run = subprocess.run([sys.executable, __file__, "--tree-launcher", method, "--model", model],
                         cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"the {method} launcher failed:\n{run.stdout}{run.stderr}")
    wall = time.monotonic() - start
    _reap_all()  # orphans of the launcher (forkserver, resource tracker) came back to us
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="tree runs per method")
    parser.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen3"))
    parser.add_argument("--child-launcher", choices=["spawn", "forkserver"])
    parser.add_argument("--tree-launcher", choices=["spawn", "forkserver"])
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    if args.child_launcher:
        return child_launcher(args.child_launcher, args.children)
    if args.tree_launcher:
        return tree_launcher(args.tree_launcher, args.model)

    from report import machine_line
    print(machine_line(), flush=True)
    print("$ python benchmark/start_cpu.py " + " ".join(sys.argv[1:]), flush=True)
    print(f"每个子进程在运行目标之前的 CPU（{args.children} 个子进程，依次启动）", flush=True)
    for method in ("spawn", "forkserver"):
        print(f"  [{method}]", flush=True)
        subprocess.run([sys.executable, __file__, "--child-launcher", method,
                        "--children", str(args.children)], check=True, cwd=ROOT)
    _become_subreaper()
    print(f"\nLLM(tp_size=2) 启动、生成 2 × 16 个 token、关闭：整棵进程树的 CPU"
          f"（{Path(args.model).name}，每种方式 {args.rounds} 次）")
    for method in ("spawn", "forkserver"):
        runs = [tree_cpu(method, args.model) for _ in range(args.rounds)]
        shown = "；".join(f"CPU {cpu:.1f} 秒（用时 {wall:.1f} 秒）" for cpu, wall in runs)
        print(f"  [{method}] {shown}", flush=True)


if __name__ == "__main__":
    main()
