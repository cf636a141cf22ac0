"""CPU time of a server's processes, read from /proc (Linux): which process is busy.

`python -m minisgl` is one launcher process (it also runs the API server) and its workers,
started in a fixed order (server/launch.py, start_backend): the scheduler of each TP rank, then
the tokenizer processes (one by default; with --num-tokenizer N, N tokenizers and a
detokenizer). A process whose CPU time grows as fast as the wall clock is using a whole core:
if it is single-threaded Python, it can go no faster, and it sets the pace.
"""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3, the state, first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (all its threads); None once it is gone."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of a process, keyed "name/tid" (a thread's name is
    its process's unless it set one: PyTorch's OpenMP workers keep it, libzmq's are ZMQbg)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        found[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return found


def busiest_threads(before: dict[str, float], after: dict[str, float], seconds: float,
                    top: int = 6) -> str:
    """The threads that used the most CPU between two thread_seconds() readings, as shares of
    one core, e.g. 'python3/812 0.98 · python3/840 0.41 · ... (23 threads)'."""
    used = sorted(((after[t] - before.get(t, 0.0), t) for t in after), reverse=True)
    shown = " · ".join(f"{t} {s / seconds:.2f}" for s, t in used[:top])
    return f"{shown}（共 {len(used)} 个线程）"


def children(pid: int) -> list[int]:
    """The worker processes of `pid` in the order they started. Multiprocessing's helpers are
    not workers: the resource tracker is bookkeeping, left out; the forkserver (chapter 13)
    forks the workers, so they are its children (with its command line), standing in for it."""
    found = []
    for start, child, cmdline in _children(pid):
        if b"multiprocessing.forkserver" in cmdline:
            found += [(s, worker) for s, worker, _ in _children(child)]
        elif b"resource_tracker" not in cmdline:
            found.append((start, child))
    return [child for _, child in sorted(found)]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, helpers included: its children, theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        kids = [child for _, child, _ in _children(todo.pop())]
        found += kids
        todo += kids
    return found


def _children(pid: int) -> list[tuple[int, int, bytes]]:
    """(start time, pid, command line) of each child of `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is None or int(fields[1]) != pid:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        found.append((int(fields[19]), int(entry.name), cmdline))  # field 22: start time
    return found


def server_processes(launcher: int, ranks: int) -> dict[str, int]:
    """The processes of a running `python -m minisgl` by role, in start_backend's order."""
    kids = children(launcher)
    schedulers, tokenizers = kids[:ranks], kids[ranks:]
    names = [f"scheduler-rank{r}" for r in range(len(schedulers))]
    if len(tokenizers) == 1:
        names.append("tokenizer")  # it tokenizes and detokenizes
    else:
        names += [f"tokenizer-{i}" for i in range(len(tokenizers) - 1)] + ["detokenizer"]
    return {"API Server（启动者）": launcher, **dict(zip(names, schedulers + tokenizers))}


def snapshot(processes: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each process that is still there."""
    seconds = {name: cpu_seconds(pid) for name, pid in processes.items()}
    return {name: s for name, s in seconds.items() if s is not None}
