"""Child processes of a server: start them, wait until each reports ready, stop them all.

Every child reports through one queue: ("ready", name, info) once it can serve, or
("failed", name, traceback) if it raised, while starting or later: so the launcher tells
"still loading" from "dead", and which child's death ended the run.
"""

from __future__ import annotations

import glob
import importlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

# Not fork: a child would inherit the launcher's threads, ZMQ sockets and CUDA half alive. Not
# spawn: each child would import torch again. The forkserver imports the heavy modules once.
_CTX = mp.get_context("forkserver")
# Safe to fork after: they open no socket and leave CUDA uninitialised. Third-party only: the
# forkserver ignores the launcher's sys.path, so our own modules could come from another tree.
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


class Children:
    """The child processes of one run and the queue they report to. `run_id`: the run whose IPC
    socket files stop() removes (utils/zmq_queue.py names them)."""

    def __init__(self, run_id: str = "") -> None:
        self.run_id = run_id
        self.processes: list[BaseProcess] = []
        self.ready: dict[str, Any] = {}  # the info each child reported ready with, by name
        self.failures: dict[str, str] = {}  # tracebacks reported after start-up, by name, in order
        self._queue = _CTX.Queue()

    def start(self, target: str, name: str, **kwargs: Any) -> BaseProcess:
        """Run target(**kwargs, status=reporter) in a new process named `name`; the target calls
        reporter.ready() once it serves. `target` is "module:function", imported in the child:
        the launcher need not import what only its children run (transformers, the engine)."""
        # daemon: should the launcher's own code raise and end the interpreter, multiprocessing
        # terminates the children on the way out instead of waiting for them forever.
        process = _CTX.Process(target=_child_main, name=name, daemon=True,
                               args=(target, dict(os.environ), kwargs, Reporter(self._queue, name)))
        process.start()
        self.processes.append(process)
        return process

    def _get(self, timeout: float) -> tuple[str, str, Any] | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def wait_ready(self, timeout: float = 600.0) -> dict[str, Any]:
        """Wait until every child started so far has reported ready; returns `ready`. Raises
        RuntimeError naming the child that failed or died, or the time that ran out."""
        deadline = time.monotonic() + timeout
        while len(self.ready) < len(self.processes):
            dead = [p for p in self.processes  # not one that was ready, then ended
                    if p.exitcode is not None and p.name not in self.ready]
            # Once a child has died, wait longer: its traceback may still be on its way.
            report = self._get(timeout=1.0 if dead else 0.2)
            if report is not None and report[0] == "ready":
                self.ready[report[1]] = report[2]
            elif report is not None:
                _, name, info = report
                # A rank fails because its peer died (a broken connection): name the dead too.
                others = "".join(f"{p.name} exited with code {p.exitcode} before it was ready\n"
                                 for p in self.processes
                                 if p.exitcode is not None and p.name != name)
                raise RuntimeError(f"{others}{name} failed while starting:\n{info}")
            elif dead:
                raise RuntimeError(", ".join(f"{p.name} exited with code {p.exitcode}"
                                             for p in dead) + " before it was ready")
            elif time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.ready)} of {len(self.processes)} processes "
                                   f"were ready after {timeout:.0f} s")
        return self.ready

    def first_exit(self) -> ChildExit | None:
        """The child whose exit ended the run, or None while all are running: one that died
        without a traceback (killed: it could not report), else the first that raised (the
        others may have raised because it died)."""
        dead = {p.name: p.exitcode for p in self.processes if p.exitcode is not None}
        if not dead:
            return None
        while (report := self._get(timeout=0)) is not None:
            if report[0] == "failed":
                self.failures[report[1]] = report[2]
        silent = [name for name in dead if name not in self.failures]
        name = silent[0] if silent else next(n for n in self.failures if n in dead)
        return ChildExit(name, dead[name], self.failures.get(name, ""))

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every child, SIGKILL what is still alive after `timeout` seconds, then remove
        the run's IPC socket files: a killed child cannot, and nothing else will use them."""
        for p in self.processes:
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()
        if self.run_id:
            pattern = os.path.join(tempfile.gettempdir(), f"minisgl-{self.run_id}-*")
            for path in glob.glob(pattern):
                os.unlink(path)


def _exit_with_launcher() -> None:
    """A thread that ends this process once the launcher is gone, so a launcher killed without
    warning (SIGKILL) leaves no orphans behind."""
    # Our parent is the forkserver. join() waits on a pipe whose write end only the launcher
    # holds: the kernel closes it however the launcher dies.
    launcher = mp.parent_process()
    assert launcher is not None

    def watch() -> None:
        launcher.join()
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def _child_main(target: str, environ: dict[str, str], kwargs: dict[str, Any],
                status: Reporter) -> None:
    # Ctrl-C reaches the whole process group; only the launcher acts on it, then stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_launcher()
    # The forkserver's environment is the launcher's from when the forkserver started; take the
    # launcher's as it is now (e.g. a trace switched on since), as a spawned child would.
    os.environ.clear()
    os.environ.update(environ)
    try:
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)(**kwargs, status=status)
    except Exception:
        # Reported, not printed: the launcher prints the one that ended the run. No interpreter
        # teardown after a failure: it only adds noise or hangs (a broken process group).
        status.failed(traceback.format_exc())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def rendezvous_address(run_id: str) -> str:
    """Where the TP ranks of one run meet (torch's FileStore): unlike a TCP port picked in
    advance, no one else can take this name. The last rank to leave removes the file."""
    return f"file://{os.path.join(tempfile.gettempdir(), f'minisgl-{run_id}-rendezvous')}"
