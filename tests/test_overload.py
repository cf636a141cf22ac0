"""Chapter 21: the requests waiting for their first token are bounded (--max-queued-req); one
more is answered at once by the API server with an OpenAI-style 503, and every request it
accepted still completes and gives its KV pages back."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from processes import ROOT, Child, descendants_of, wait_all_gone

CHAPTER = 21  # tools/steps.py check runs this module on chapter 21's own tree

MODEL = ROOT / "models" / "tiny-qwen3"


@pytest.fixture
def frontend():
    from minisgl.server.frontend import Frontend
    from minisgl.utils.zmq_queue import ipc_address, new_run_id

    run_id = new_run_id()
    frontend = Frontend([ipc_address(run_id, "tokenizer")], ipc_address(run_id, "frontend"),
                        max_queued=2)
    yield frontend
    frontend.close()


def test_a_request_beyond_the_queue_bound_is_refused_until_one_is_answered(frontend):
    from minisgl.core import SamplingParams
    from minisgl.message import UserReply
    from minisgl.server.protocol import APIError

    first, _ = frontend.submit("a", SamplingParams())
    second, _ = frontend.submit("b", SamplingParams())
    with pytest.raises(APIError, match="2 requests are waiting for their first token") as info:
        frontend.submit("c", SamplingParams())
    assert (info.value.status, info.value.kind) == (503, "server_error")
    frontend._deliver([UserReply(first, " x", False, prompt_tokens=1)])  # the first one runs
    third, _ = frontend.submit("c", SamplingParams())
    frontend.abort(second)  # its client left while it waited
    frontend.submit("d", SamplingParams())
    assert frontend.queued == {third, third + 1}


def test_the_queue_bound_must_be_positive(capsys):
    from minisgl.server.args import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", str(MODEL), "--port", "0", "--max-queued-req", "0"])
    assert "--max-queued-req must be >= 1, got 0" in capsys.readouterr().err


def stream_until(url: str, started: threading.Event, leave: threading.Event) -> None:
    """A request that holds the server's only row until `leave` is set."""
    with httpx.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={
                "prompt": "A story that never ends:", "max_tokens": 4000, "ignore_eos": True,
                "stream": True}) as r:
            for _ in r.iter_lines():
                started.set()
                if leave.is_set():
                    return


def assert_every_page_comes_back(url: str, timeout: float = 10.0) -> None:
    """Once nothing runs or waits, every KV page is free or in the prefix cache (a request
    that finished in the batch in flight gives its pages back one step later)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"{url}/stats", timeout=30).json()
        idle = (stats["running"], stats["waiting"], stats["locked_pages"]) == (0, 0, 0)
        if idle and stats["free_pages"] + stats["cached_pages"] == stats["num_pages"]:
            return
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)


def test_requests_beyond_the_bound_get_503_and_the_accepted_one_completes():
    server = Child([sys.executable, "-m", "minisgl", "--model", str(MODEL), "--port", "0",
                    "--max-running-req", "1", "--max-queued-req", "1"])
    try:
        url = server.served_url()
        server.children = descendants_of(server.pid)
        started, leave = threading.Event(), threading.Event()
        holder = threading.Thread(target=stream_until, args=(url, started, leave), daemon=True)
        holder.start()
        assert started.wait(60)
        # The only row is taken: the first of these waits for it, the other nine are refused.
        with httpx.Client(base_url=url, timeout=120) as http, ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(http.post, "/v1/completions", json={
                "prompt": f"Request {i}:", "max_tokens": 8, "ignore_eos": True})
                for i in range(10)]
            deadline = time.monotonic() + 60
            while sum(f.done() for f in futures) < 9 and time.monotonic() < deadline:
                time.sleep(0.05)
            done = [f for f in futures if f.done()]
            # Answered while the holder still streams: none of them waited for a row.
            assert holder.is_alive() and len(done) == 9, len(done)
            assert all(f.result().status_code == 503 for f in done)
            leave.set()  # the holder leaves: the waiting request gets the row
            responses = [f.result() for f in futures]
        [accepted] = [r for r in responses if r.status_code == 200]
        assert accepted.json()["usage"]["completion_tokens"] == 8
        for r in responses:
            if r is not accepted:
                error = r.json()["error"]
                assert error["type"] == "server_error"
                assert "--max-queued-req 1" in error["message"], error
        holder.join(30)
        assert_every_page_comes_back(url)
        code = server.stop()
    finally:
        if server.popen.poll() is None:
            server.stop()
    assert code == 0, server.output
    assert not wait_all_gone(server.children, timeout=5.0)


def test_help_documents_the_queue_bound_and_its_default():
    from minisgl.server.args import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--max-queued-req MAX_QUEUED_REQ" in text
    assert "answers one more at once with 503 (default: 4096)" in text
