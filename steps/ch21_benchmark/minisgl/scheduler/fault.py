"""A step that fails on purpose, to see how a server ends when its device faults:
MINISGL_DEBUG_FAULT_STEP=N, read when a scheduler process starts, corrupts the page table just
before step N, so that the step's attention reads out of range, as a scheduler bug would make it."""

from __future__ import annotations

import os

from minisgl.utils import use_stream

from .scheduler import Scheduler

BAD_SLOT = 2**31 - 1  # the largest page-table entry: past the end of any KV pool


def fault_step_from_env() -> int | None:
    """The step MINISGL_DEBUG_FAULT_STEP names; None when it is not set (or 0)."""
    return int(os.environ.get("MINISGL_DEBUG_FAULT_STEP") or 0) or None


def corrupt_page_table(scheduler: Scheduler) -> bool:
    """Point the first KV slot of each running request at BAD_SLOT, where the next step's
    attention reads it. False when no request runs: no step would read the change."""
    rows = [req.table_idx for req in scheduler.decode.running]
    if not rows:
        return False
    # On the preparation stream, which the next step's forward waits for.
    with use_stream(scheduler.engine.prepare_stream):
        scheduler.engine.page_table[rows, 0] = BAD_SLOT
    return True
