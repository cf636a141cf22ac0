"""Chapter 21: a scheduler step that fails ends the server with one line naming the step.

MINISGL_DEBUG_FAULT_STEP=N corrupts the page table before step N (scheduler/fault.py): on the
CPU the step's attention raises IndexError, as a GPU's raises an illegal memory access. The
server must then exit non-zero, say which step failed and why, and leave nothing behind.
"""

from __future__ import annotations

import signal
import sys
import threading

import httpx
import pytest

from processes import ROOT, Child, descendants_of, wait_all_gone

CHAPTER = 21  # tools/steps.py check runs this module on chapter 21's own tree

MODEL = ROOT / "models" / "tiny-qwen3"
EXIT_TIMEOUT = 30.0  # seconds from the failing step to the launcher's exit


class FakeScheduler:
    """What SchedulerLoop asks of a Scheduler, with a step that raises."""

    class Queue:
        running = [object(), object()]
        pending = [object()]

    decode = prefill = Queue()
    has_work = True

    def __init__(self, error: Exception) -> None:
        self.error = error

    def step(self) -> list:
        raise self.error


class NoIO:
    def receive(self, blocking: bool) -> list:
        return []

    def send(self, messages: list) -> None:
        pass


@pytest.mark.parametrize("error, shown", [
    (IndexError("index out of range in self"), "IndexError: index out of range in self"),
    # A CUDA error's message goes on for lines of advice: the first one says what happened.
    (RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors "
                  "might be asynchronously reported"),
     "RuntimeError: CUDA error: an illegal memory access was encountered"),
])
def test_a_step_that_raises_is_named_in_one_line(error, shown):
    from minisgl.scheduler.io import SchedulerLoop, StepFailed

    loop = SchedulerLoop(FakeScheduler(error), NoIO())  # type: ignore[arg-type]
    with pytest.raises(StepFailed) as info:
        loop.run_once()
    assert str(info.value) == f"step 1 failed (2 requests running, 1 waiting): {shown}"
    assert info.value.__cause__ is error


def read_until_closed(url: str, events: list[str]) -> None:
    """A stream that would run for minutes: its events, until the server ends it."""
    with httpx.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={
                "prompt": "A story that never ends:", "max_tokens": 4000, "ignore_eos": True,
                "stream": True}) as r:
            events += [line for line in r.iter_lines() if line.startswith("data: ")]


def test_a_faulty_step_ends_the_server_naming_the_step(monkeypatch):
    monkeypatch.setenv("MINISGL_DEBUG_FAULT_STEP", "6")
    server = Child([sys.executable, "-m", "minisgl", "--model", str(MODEL), "--port", "0"])
    try:
        url = server.served_url()
        server.children = descendants_of(server.pid)
        streams: list[list[str]] = [[] for _ in range(3)]
        clients = [threading.Thread(target=read_until_closed, args=(url, events), daemon=True)
                   for events in streams]
        for client in clients:
            client.start()
        code = server.wait(EXIT_TIMEOUT)
        for client in clients:
            client.join(10)
    finally:
        if server.popen.poll() is None:
            server.stop(signal.SIGKILL)
    assert code == 1, server.output
    [line] = [x for x in server.output.splitlines() if "scheduler-rank0" in x]
    assert line.startswith("minisgl: scheduler-rank0 exited with code 1 (minisgl.scheduler.io."
                           "StepFailed: step 6 failed ("), line
    assert "waiting): IndexError: index out of range in self); " in line, line
    assert any(streams), "no stream ran until the faulty step"
    for events in filter(None, streams):  # (one that came after it had a 503 and no events)
        assert "the server is stopping: scheduler-rank0" in events[-2], events[-3:]
        assert events[-1] == "data: [DONE]"
    assert not wait_all_gone(server.children, timeout=5.0), "children left running"
    assert not server.socket_files()
