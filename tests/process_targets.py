"""Targets for the child-process tests (tests/test_tokenizer.py, tests/test_faults.py).

A child rebuilds its target by importing it by name, so the targets are top-level functions of
a module on sys.path. multiprocessing hands the parent's sys.path to the child (forkserver and
spawn alike), and pytest puts tests/ on it (pyproject: pythonpath), so the child finds this
module.
Keep the imports light: every child imports this file.
"""

from __future__ import annotations

import os
import resource
import signal
import time


def ready_then_sleep(*, status, seconds: float = 60.0) -> None:
    """Report ready (with the child's pid as the info), then idle."""
    status.ready(os.getpid())
    time.sleep(seconds)


def ready_late(*, status) -> None:
    """Report ready after two seconds (longer than a wait for a dead child's report), then idle."""
    time.sleep(2.0)
    ready_then_sleep(status=status)


def raise_while_starting(*, status) -> None:
    raise FileNotFoundError("no checkpoint at /nowhere/model")


def exit_without_reporting(*, status) -> None:
    """Dies at once without a word, neither ready nor failed (as if the OOM killer took it)."""
    os._exit(3)


def ignore_sigterm(*, status) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    status.ready(os.getpid())
    time.sleep(60.0)


def report_start_up(*, status) -> None:
    """Report the CPU seconds this child spent before its target ran (minisgl.utils.process,
    which it imports to run us, imports torch), and one variable of its environment."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    status.ready({"cpu": usage.ru_utime + usage.ru_stime,
                  "env": os.environ.get("MINISGL_TEST_LATE_VARIABLE")})


def hold_peer(*, status, peer) -> None:
    """Idle, holding one end of a pipe: the other end breaks when we die. It reports nothing:
    a child killed while it writes to the report queue would leave the queue's lock held."""
    time.sleep(60.0)


def fail_when_peer_dies(*, status, peer) -> None:
    """Report ready, then wait on a pipe whose other end a peer holds: EOFError once the peer
    dies, as a rank's all-reduce fails once the connection to another rank breaks."""
    status.ready(os.getpid())
    peer.recv()
