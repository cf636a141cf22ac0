"""Child processes of a server: start them, wait until each reports ready, stop them all.

Every child reports through one queue: ("ready", name, info) once it can serve, or
("failed", name, traceback) if it raised, while starting or later. So the launcher can tell
"still loading" from "dead" and never waits forever on a child that is gone; and once one has
died while serving, it can say which one ended the run, and how, in one line.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

# forkserver: a fresh interpreter, started once per launcher, imports the heavy modules below
# and then forks one copy of itself per child. Not fork: the launcher has threads, ZMQ sockets
# and perhaps CUDA, which a forked child would inherit half alive. Not spawn: each spawned child
# is a new interpreter that imports torch again, over a second of CPU per child.
_CTX = mp.get_context("forkserver")
# Importing these opens no socket and leaves CUDA uninitialised (torch initialises it on first
# use), so each child still picks its own GPU; the one thread they start, OpenBLAS's pool under
# numpy, stops and restarts around fork itself. So forking after them is safe.
# Third-party only: the forkserver of Python 3.11 and 3.12 ignores the launcher's sys.path, so
# our own modules could come from another tree; a child imports those itself, in milliseconds.
_PRELOAD = ["torch", "safetensors", "zmq", "msgpack", "transformers.models.auto.tokenization_auto"]
_CTX.set_forkserver_preload(_PRELOAD)


class Reporter:
    """What a child is given to report on its own start-up."""

    def __init__(self, queue: Any, name: str) -> None:
        self._queue, self.name = queue, name

    def ready(self, info: Any = None) -> None:
        self._queue.put(("ready", self.name, info))

    def failed(self, error: str) -> None:
        """Report a traceback; returns once it is in the pipe, as the caller exits next."""
        self._queue.put(("failed", self.name, error))
        self._queue.close()
        self._queue.join_thread()


class ReadyQueue:
    """Where the children of one launcher report."""

    def __init__(self) -> None:
        self._queue = _CTX.Queue()
        self.failures: dict[str, str] = {}  # tracebacks reported after start-up, by name, in order

    def reporter(self, name: str) -> Reporter:
        return Reporter(self._queue, name)

    def get(self, timeout: float) -> tuple[str, str, Any] | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def collect_failures(self) -> dict[str, str]:
        """`failures`, with the reports that have come since it was last called."""
        while (report := self.get(timeout=0)) is not None:
            if report[0] == "failed":
                self.failures[report[1]] = report[2]
        return self.failures


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


@dataclass(frozen=True)
class ChildExit:
    """How a child process ended: its name, its exit code, and its traceback if it raised."""

    name: str
    exitcode: int
    traceback: str = ""

    def __str__(self) -> str:
        """One line: "scheduler-rank1 was killed by SIGKILL", "tokenizer-0 exited with code 1
        (ValueError: ...)"."""
        how = (f"was killed by {_signal_name(-self.exitcode)}" if self.exitcode < 0
               else f"exited with code {self.exitcode}")
        error = self.traceback.strip().splitlines()[-1:]  # the exception's own line
        return f"{self.name} {how}" + (f" ({error[0]})" if error else "")


def first_exit(processes: list[BaseProcess], status: ReadyQueue) -> ChildExit | None:
    """The child whose exit ended the run, or None while all are running. A child that raised
    because another one died (a rank whose peer's connection broke) did not cause anything:
    children that died without a traceback come first (killed: they could not report), then
    those that raised, in the order their reports came."""
    dead = {p.name: p.exitcode for p in processes if p.exitcode is not None}
    if not dead:
        return None
    failures = status.collect_failures()
    silent = [name for name in dead if name not in failures]
    name = silent[0] if silent else next(n for n in failures if n in dead)
    return ChildExit(name, dead[name], failures.get(name, ""))


def _exit_with_launcher() -> None:
    """A thread that ends this process once the launcher is gone, so a launcher killed without
    warning (SIGKILL) leaves no orphans behind."""
    # Our parent is the forkserver, not the launcher. multiprocessing hands each child the read
    # end of a pipe whose write end only the launcher holds: the kernel closes it when the
    # launcher dies, however it dies, and join() returns.
    launcher = mp.parent_process()
    assert launcher is not None

    def watch() -> None:
        launcher.join()
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def _child_main(target: Callable[..., None], environ: dict[str, str], kwargs: dict[str, Any],
                status: Reporter) -> None:
    # Ctrl-C reaches the whole process group; only the launcher acts on it, then stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_launcher()
    # The forkserver's environment is the launcher's from when the forkserver started; take the
    # launcher's as it is now (e.g. a trace switched on since), as a spawned child would.
    os.environ.clear()
    os.environ.update(environ)
    try:
        target(**kwargs, status=status)
    except Exception:
        # Reported, not printed: the launcher prints it if this failure is what ended the run.
        # One caused by another child's death (a broken connection) would bury the line that
        # names the cause. No interpreter teardown after a failure: it only adds noise
        # (extension modules reporting leaks) or hangs (a broken process group).
        status.failed(traceback.format_exc())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def start_process(target: Callable[..., None], name: str, status: ReadyQueue,
                  **kwargs: Any) -> BaseProcess:
    """Run target(**kwargs, status=reporter) in a new process named `name`; the target calls
    reporter.ready() once it serves."""
    # daemon: should the launcher's own code raise and end the interpreter, multiprocessing
    # terminates the children on the way out instead of waiting for them forever.
    process = _CTX.Process(target=_child_main, name=name, daemon=True,
                           args=(target, dict(os.environ), kwargs, status.reporter(name)))
    process.start()
    return process


def wait_ready(processes: list[BaseProcess], status: ReadyQueue, expected: int,
               timeout: float = 600.0) -> dict[str, Any]:
    """Wait for `expected` ready reports; their info by name. Raises RuntimeError naming the
    child that failed or died, or the time that ran out."""
    infos: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while len(infos) < expected:
        report = status.get(timeout=0.2)
        if report is not None:
            kind, name, info = report
            if kind == "failed":
                # A rank fails because its peer died (a broken connection): name the dead too.
                dead = "".join(f"{p.name} exited with code {p.exitcode} before it was ready\n"
                               for p in processes if p.exitcode is not None and p.name != name)
                raise RuntimeError(f"{dead}{name} failed while starting:\n{info}")
            infos[name] = info
            continue
        dead = [p for p in processes if p.exitcode is not None]
        if dead:
            time.sleep(0.5)  # a dying child's traceback may still be on its way
            report = status.get(timeout=0.5)
            if report is not None and report[0] == "failed":
                raise RuntimeError(f"{report[1]} failed while starting:\n{report[2]}")
            raise RuntimeError(", ".join(f"{p.name} exited with code {p.exitcode}" for p in dead)
                               + " before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(infos)} of {expected} processes were ready "
                               f"after {timeout:.0f} s")
    return infos


def rendezvous_address(run_id: str) -> str:
    """Where the TP ranks of one run meet to build their process group: a file of this run
    (torch's FileStore). A TCP port picked in advance could be taken by anyone before rank 0
    binds it; this name is ours alone. The last rank to leave the group removes the file."""
    return f"file://{os.path.join(tempfile.gettempdir(), f'minisgl-{run_id}-rendezvous')}"


def stop_processes(processes: list[BaseProcess], timeout: float = 5.0) -> None:
    """SIGTERM every child, then SIGKILL what is still alive after `timeout` seconds."""
    for p in processes:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            p.kill()
            p.join()
