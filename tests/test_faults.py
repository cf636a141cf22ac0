"""Chapter 16: a process of the server dies while the server is busy.

- On a real `python -m minisgl` (tiny-qwen3, CPU), 32 streams and one non-streaming request
  are generating when one process is SIGKILLed: the tokenizer, the scheduler (TP=1), or rank 1
  of a TP=2 server (rank 0 then fails on its broken gloo connection). Within 5 s every stream
  ends with an OpenAI error event naming the dead process and then [DONE]; the non-streaming
  request and a request that arrives afterwards get a 503 with the same message; the log names
  the process in one line, with no traceback; the launcher exits 1 and leaves no process, no
  IPC socket file and no semaphore behind.
- In this process: which child ended the run when several have died (the killed one, not the
  rank that failed because of it); the Frontend and the app after a failure.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx
import pytest

from conftest import MODELS_DIR, TINY_QWEN3
from processes import Child, descendants_of, wait_all_gone, workers_of

CHAPTER = 16  # tools/steps.py check runs this module on chapter 16's own tree

STREAMS = 32
ERROR_WITHIN_S = 5.0  # from the kill to the end of the last stream
# Far more decode steps than fit between the first token and the kill; pages for all 33
# requests at once (prompt and max_tokens each).
REQUEST = {"max_tokens": 1000, "ignore_eos": True, "temperature": 0}
SERVER_ARGS = ["--max-seq-len", "1024", "--num-pages", "36000"]


# ----------------------------------------------------------------------------------------------
# A real server, busy, and one of its processes killed


@dataclass
class Victim:
    tp: int
    index: int  # in workers_of(): the ranks start first, then the tokenizer
    name: str


VICTIMS = {"tokenizer": Victim(1, 1, "tokenizer-0"), "scheduler": Victim(1, 0, "scheduler-rank0"),
           "rank1": Victim(2, 1, "scheduler-rank1")}


def unfinished_post(url: str, path: str, body: dict) -> tuple[socket.socket, bytes]:
    """A POST whose headers the server has and whose body lacks its last byte: the server
    holds the request open until that byte comes. The socket, and the byte."""
    raw = json.dumps(body).encode()
    address = urlparse(url)
    sock = socket.create_connection((address.hostname, address.port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\nConnection: close\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
                 + raw[:-1])
    return sock, raw[-1:]


def finish_post(sock: socket.socket, last: bytes) -> tuple[int, dict] | str:
    """Send the last byte; the status and JSON body of the answer, or what went wrong."""
    try:
        with sock:
            sock.sendall(last)
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)
    except (OSError, IndexError, ValueError) as e:
        return f"no answer: {e!r}"


async def stream(client: httpx.AsyncClient, i: int, started: asyncio.Semaphore
                 ) -> tuple[int, list[str], float]:
    """Status, the SSE payloads (a broken connection is the last one), and when it ended."""
    body = {"prompt": f"Story number {i}:", "stream": True, **REQUEST}
    status, events = 0, []
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    if len(events) == 1:
                        started.release()
    except httpx.HTTPError as e:
        events.append(repr(e))
    return status, events, time.monotonic()


async def all_running(client: httpx.AsyncClient, requests: int) -> None:
    """Until the scheduler runs `requests` requests: the non-streaming one has no event to
    await, so the scheduler's counters are asked."""
    while (await client.get("/stats")).json()["running"] < requests:
        await asyncio.sleep(0.05)


@dataclass
class Outcome:
    streams: list[tuple[int, list[str], float]]
    non_stream: httpx.Response | str
    late: tuple[int, dict] | str
    killed_at: float
    code: int
    output: str


async def kill_while_busy(url: str, victim_pid: int) -> tuple[list, httpx.Response | str,
                                                             tuple[int, dict] | str, float]:
    """Open the requests, SIGKILL the victim once all of them are generating; what the streams,
    the non-streaming request and the late request got, and when the kill was."""
    late = unfinished_post(url, "/v1/completions", {"prompt": "late", **REQUEST})
    limits = httpx.Limits(max_connections=STREAMS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        non_stream = asyncio.create_task(client.post("/v1/completions",
                                                     json={"prompt": "x", **REQUEST}))
        started = asyncio.Semaphore(0)
        streams = [asyncio.create_task(stream(client, i, started)) for i in range(STREAMS)]
        for _ in range(STREAMS):  # every stream has its first token
            await asyncio.wait_for(started.acquire(), 120)
        await asyncio.wait_for(all_running(client, STREAMS + 1), 60)
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        ended = await asyncio.wait_for(asyncio.gather(*streams), 30)
        try:
            answer = await asyncio.wait_for(non_stream, 30)
        except httpx.HTTPError as e:
            answer = repr(e)
    return ended, answer, finish_post(*late), killed_at


@pytest.fixture(scope="module", params=list(VICTIMS))
def outcome(request) -> tuple[Victim, Outcome]:
    """A busy server, one of its processes SIGKILLed, and what everyone saw."""
    victim = VICTIMS[request.param]
    child = Child([sys.executable, "-m", "minisgl", "--model", str(MODELS_DIR / TINY_QWEN3),
                   "--port", "0", "--tp", str(victim.tp), *SERVER_ARGS])
    try:
        url = child.served_url()
        everyone = descendants_of(child.popen.pid)
        victim_pid = workers_of(child.popen.pid)[victim.index]
        streams, non_stream, late, killed_at = asyncio.run(kill_while_busy(url, victim_pid))
        code = child.wait(timeout=30)
    finally:
        if child.popen.poll() is None:
            child.popen.kill()
            child.popen.wait()
    assert not wait_all_gone(everyone, timeout=5.0), "children left running"
    assert not child.socket_files()
    return victim, Outcome(streams, non_stream, late, killed_at, code, child.output)


def expected_error(victim: Victim) -> dict:
    return {"message": f"the server is stopping: {victim.name} was killed by SIGKILL",
            "type": "server_error", "param": None, "code": None}


def test_every_open_stream_ends_with_an_error_event_then_done(outcome):
    victim, seen = outcome
    for status, events, _ in seen.streams:
        assert status == 200
        assert all("choices" in json.loads(e) for e in events[:-2]) and events[:-2]  # text
        assert json.loads(events[-2]) == {"error": expected_error(victim)}, events[-3:]
        assert events[-1] == "[DONE]"


def test_every_stream_ends_within_five_seconds_of_the_kill(outcome):
    _, seen = outcome
    took = max(ended for _, _, ended in seen.streams) - seen.killed_at
    assert took < ERROR_WITHIN_S, f"the last stream ended {took:.1f} s after the kill"


def test_a_request_in_flight_and_one_arriving_later_get_503(outcome):
    victim, seen = outcome
    assert isinstance(seen.non_stream, httpx.Response), seen.non_stream
    assert seen.non_stream.status_code == 503
    assert seen.non_stream.json() == {"error": expected_error(victim)}
    assert seen.late == (503, {"error": expected_error(victim)})


def test_the_log_names_the_dead_process_in_one_line_without_tracebacks(outcome):
    victim, seen = outcome
    lines = [line for line in seen.output.splitlines() if victim.name in line]
    assert lines == [f"minisgl: {victim.name} was killed by SIGKILL; {STREAMS + 1} open "
                     "requests end with an error; shutting down"], seen.output
    for noise in ("Traceback", "CancelledError", "Connection reset", "resource_tracker"):
        assert noise not in seen.output, seen.output


def test_the_launcher_exits_1_and_stops_every_child(outcome):
    _, seen = outcome
    assert seen.code == 1, seen.output
    assert "minisgl: stopped" in seen.output


# ----------------------------------------------------------------------------------------------
# Which child ended the run


def test_the_killed_child_is_named_not_the_one_that_failed_because_of_it():
    """Rank 0 raises once its peer's connection breaks, as it does in an all-reduce: the cause
    is the peer, which could report nothing. Rank 0's traceback is kept, not printed."""
    from minisgl.utils.process import Children

    children = Children()
    rank0_end, rank1_end = multiprocessing.Pipe()
    try:
        rank0 = children.start("process_targets:fail_when_peer_dies", "scheduler-rank0",
                               peer=rank0_end)
        children.wait_ready(timeout=60)  # before rank 1, which never reports
        rank1 = children.start("process_targets:hold_peer", "scheduler-rank1", peer=rank1_end)
        rank0_end.close()  # the children have their own copies
        rank1_end.close()
        assert children.first_exit() is None
        rank1.kill()
        for p in children.processes:
            p.join(timeout=30)
        exited = children.first_exit()
    finally:
        children.stop()
    assert rank0.exitcode == 1
    assert exited is not None and str(exited) == "scheduler-rank1 was killed by SIGKILL"
    assert "EOFError" in children.failures["scheduler-rank0"]


def test_a_child_that_raised_is_named_with_its_exception():
    from minisgl.utils.process import ChildExit

    traceback = "Traceback (most recent call last):\n  ...\nValueError: no such page\n"
    assert str(ChildExit("tokenizer-0", 1, traceback)) == \
        "tokenizer-0 exited with code 1 (ValueError: no such page)"
    assert str(ChildExit("tokenizer-0", -signal.SIGTERM)) == "tokenizer-0 was killed by SIGTERM"


# ----------------------------------------------------------------------------------------------
# The Frontend and the app after a failure, in this process


@pytest.fixture
def frontend():
    from minisgl.server.frontend import Frontend
    from minisgl.utils.zmq_queue import ipc_address, new_run_id

    run_id = new_run_id()
    frontend = Frontend([ipc_address(run_id, "tokenizer")], ipc_address(run_id, "frontend"))
    yield frontend
    frontend.close()


def test_a_waiting_request_gets_its_queued_replies_then_the_failure(frontend):
    from minisgl.core import SamplingParams
    from minisgl.message import UserReply
    from minisgl.server.frontend import ServerFailed

    async def fail_one() -> list:
        uid, queue = frontend.submit("x", SamplingParams(max_tokens=4))
        frontend._deliver([UserReply(uid, " Paris", False)])
        assert frontend.fail("the server is stopping: tokenizer-0 was killed by SIGKILL") == 1
        return [queue.get_nowait() for _ in range(queue.qsize())]

    first, failure = asyncio.run(fail_one())
    assert first.incremental_output == " Paris"
    assert isinstance(failure, ServerFailed) and failure.status == 503
    with pytest.raises(ServerFailed, match="tokenizer-0 was killed by SIGKILL"):
        frontend.submit("y", SamplingParams(max_tokens=4))


def test_after_a_failure_health_and_new_requests_are_503(frontend):
    from minisgl.server.api_server import create_app

    frontend.fail("the server is stopping: scheduler-rank0 was killed by SIGKILL")
    app = create_app(frontend, "m", 128)

    async def ask() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get("/health"),
                    await client.post("/v1/completions", json={"prompt": "x"})]

    for r in asyncio.run(ask()):
        assert r.status_code == 503
        assert r.json()["error"]["message"] == \
            "the server is stopping: scheduler-rank0 was killed by SIGKILL"
