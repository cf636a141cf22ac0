"""A trace of what every process of a server did, in the Chrome trace-event format (Perfetto).
Each process appends its events, a flushed JSON line each, to a part file of its own, on the
clock all processes share; `finish()` merges the parts. Off, every call tests one global."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

ENV = "MINISGL_TRACE"  # the part files' directory, inherited by child processes

_enabled = ENV in os.environ
_sink: _PartFile | None = None
_sink_lock = threading.Lock()
_process_name: str | None = None  # this process's lane name; None: multiprocessing's name


class _PartFile:
    """This process's part file; names its process and threads as Perfetto lanes."""

    def __init__(self, directory: str, process_name: str) -> None:
        self.pid = os.getpid()
        self.file = open(Path(directory) / f"{self.pid}.jsonl", "a", encoding="utf-8")
        self.named_threads: set[int] = set()
        self.flow_counts: dict[tuple[str, str, Any], int] = {}
        self.lock = threading.Lock()  # the API server writes from two threads
        self.write({"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0,
                    "args": {"name": process_name}})

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self.lock:
            self.file.write(line)
            self.file.flush()

    def event(self, event: dict[str, Any]) -> None:
        """`event` on the calling thread's lane, named the first time that thread writes."""
        tid = threading.get_native_id()
        if tid not in self.named_threads:
            self.named_threads.add(tid)
            self.write({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid,
                        "args": {"name": threading.current_thread().name}})
        self.write({**event, "pid": self.pid, "tid": tid})

    def flow_id(self, inbox: str, name: str, uid: Any) -> int:
        """The id of the next `name` message of request `uid` through `inbox`, the same at both
        ends (one sender, kept in order by ZMQ), hashed into 48 bits: Perfetto wants an integer
        and a JavaScript number holds 48 bits exactly."""
        with self.lock:
            key = (inbox, name, uid)
            n = self.flow_counts[key] = self.flow_counts.get(key, -1) + 1
        digest = hashlib.blake2b(f"{inbox}|{name}|{uid}|{n}".encode(), digest_size=6).digest()
        return int.from_bytes(digest, "big")


def _part_file() -> _PartFile:
    global _sink
    with _sink_lock:
        if _sink is None or _sink.pid != os.getpid():
            name = _process_name or multiprocessing.current_process().name
            _sink = _PartFile(os.environ[ENV], name)
        return _sink


def enabled() -> bool:
    return _enabled


def now() -> int:
    """Nanoseconds on the clock every process shares."""
    return time.monotonic_ns()


def instant(name: str, **args: Any) -> None:
    """Something that happened now: a message sent or received, a request admitted."""
    if _enabled:
        _part_file().event({"ph": "i", "s": "t", "name": name, "ts": time.monotonic_ns() / 1000,
                            "args": args})


def span(name: str, start_ns: int, **args: Any) -> None:
    """Something that ran from start_ns (a now() taken before it) until now: a step."""
    if _enabled:
        end = time.monotonic_ns()
        _part_file().event({"ph": "X", "name": name, "ts": start_ns / 1000,
                            "dur": (end - start_ns) / 1000, "args": args})


def messages(direction: str, batch: list[Any], inbox: str | None = None) -> None:
    """One event per message, named by its type, e.g. UserMsg {"dir": "recv", "uid": 3}.
    With `inbox`, the address the messages travel to (both ends know it), also the flow event
    that ties each send to its receipt: ph "s" here, or ph "f" bound to the receipt's event."""
    if not _enabled or not batch:
        return
    sink = _part_file()
    for message in batch:
        name, uid = type(message).__name__, getattr(message, "uid", None)
        ts = time.monotonic_ns() / 1000
        sink.event({"ph": "i", "s": "t", "name": name, "ts": ts,
                    "args": {"dir": direction, "uid": uid}})
        if inbox is not None:  # same ts, written after: the arrow binds to the event above
            flow = {"ph": "s" if direction == "send" else "f", "name": name, "cat": "message",
                    "id": sink.flow_id(inbox, name, uid), "ts": ts}
            if direction != "send":
                flow["bp"] = "e"  # the enclosing event (the receipt), not the next slice
            sink.event(flow)


def _parts_dir(path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(path)}.parts")


def begin(path: str | os.PathLike, process_name: str) -> None:
    """Trace this process (as `process_name`) and every process it starts from now on, until
    finish(). Leftover parts of an earlier run at the same path are removed."""
    global _enabled, _process_name, _sink
    parts = _parts_dir(path)
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    os.environ[ENV] = str(parts.resolve())
    _process_name, _sink, _enabled = process_name, None, True


def merge(parts: Path, path: str | os.PathLike) -> int:
    """Write the events of every part file into one trace at `path` (atomically: a reader
    never sees half a file); the number of events. A truncated last line is skipped."""
    events = []
    for part in sorted(parts.glob("*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a process killed while writing this line
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
    tmp = Path(f"{os.fspath(path)}.tmp")
    tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"},
                              ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)
    return len(events)


def finish(path: str | os.PathLike) -> int:
    """Stop tracing and merge the parts into `path` (call it once the traced children have
    stopped); the number of events written."""
    global _enabled, _sink
    with _sink_lock:
        if _sink is not None:
            _sink.file.close()
        _sink, _enabled = None, False
    os.environ.pop(ENV, None)
    parts = _parts_dir(path)
    count = merge(parts, path)
    shutil.rmtree(parts, ignore_errors=True)
    return count
