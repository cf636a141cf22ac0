"""Chapter 15: the OpenAI-compatible server, tested as a reader would use it.

Every test talks to a real `python -m minisgl` (tiny-qwen3 on the CPU) over real HTTP on
127.0.0.1. Three servers serve most tests, one per module-scoped fixture:

- `server`: the defaults (one tokenizer process, the model's context of 4,096 tokens);
- `server2`: `--num-tokenizer 2` (two tokenizers and a detokenizer);
- `small`: `--max-seq-len 128`, so that a chat without max_tokens fills its context quickly.

The shutdown tests come last: the SIGINT and SIGTERM tests stop `server` and `small`, the
last users of those fixtures; every fixture's teardown still checks that its server exited
with code 0 and left no child process and no IPC socket file behind. The shell, SIGKILL,
loading, one-row and launcher-error tests start processes of their own; the frontend's and the
first reply's unit tests run in this process.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from processes import (ROOT, Child, descendants_of, minisgl_env, model_that_never_loads,
                       wait_all_gone, workers_of)

CHAPTER = 15  # tools/steps.py check runs this module on chapter 15's own tree

MODEL = ROOT / "models" / "tiny-qwen3"
STOP_TIMEOUT = 15.0  # seconds from SIGINT/SIGTERM to exit code 0
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "The quick brown fox", "In 1969, astronauts", "My favourite food is",
           "Water boils at", "Seven plus five equals"]


# ----------------------------------------------------------------------------------------------
# Processes


class Process(Child):
    """A `python -m minisgl` child."""

    def __init__(self, *args: str, stdin: bool = False) -> None:
        super().__init__([sys.executable, "-m", "minisgl", *args], stdin=stdin)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        return super().stop(sig, timeout)


class Server(Process):
    """A server that is up: `ready` printed, its workers and all its descendants recorded."""

    def __init__(self, *args: str) -> None:
        super().__init__("--model", str(MODEL), "--port", "0", *args)
        try:
            self.url = self.served_url()
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        self.workers = workers_of(self.pid)
        self.children = descendants_of(self.pid)
        self.http = httpx.Client(base_url=self.url, timeout=120)
        self.openai = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)

    def completion(self, prompt: str, **fields) -> dict:
        r = self.http.post("/v1/completions", json={"prompt": prompt, **fields})
        assert r.status_code == 200, r.text
        return r.json()

    def stats(self) -> dict[str, int]:
        r = self.http.get("/stats")
        assert r.status_code == 200, r.text
        return r.json()

    def idle_stats(self, timeout: float = 10.0) -> dict[str, int]:
        """/stats once no request is running or waiting (an abort travels through two
        processes before the scheduler frees the request)."""
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while (stats["running"] or stats["waiting"]) and time.monotonic() < deadline:
            time.sleep(0.1)
            stats = self.stats()
        return stats

    def shut_down(self, sig: int = signal.SIGTERM) -> int:
        self.http.close()
        self.openai.close()
        return self.stop(sig)


def assert_stopped_cleanly(proc: Process, code: int, expected_code: int = 0) -> None:
    assert code == expected_code, proc.output
    assert "minisgl: stopped" in proc.output or expected_code != 0
    assert not wait_all_gone(proc.children, timeout=5.0), "children left running"
    assert not proc.socket_files()


def serve(*args: str):
    """The body of a server fixture: start, yield, stop with SIGTERM unless a test has
    stopped it already, and check that nothing is left behind."""
    server = Server(*args)
    try:
        yield server
    finally:
        already = server.popen.poll() is not None
        code = server.shut_down(signal.SIGTERM)
        if not already:  # a shutdown test has checked its own exit already
            assert_stopped_cleanly(server, code)
        assert not wait_all_gone(server.children, timeout=5.0)


@pytest.fixture(scope="module")
def server():
    yield from serve()


@pytest.fixture(scope="module")
def server2():
    yield from serve("--num-tokenizer", "2")


@pytest.fixture(scope="module")
def small():
    yield from serve("--max-seq-len", "128")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL)


def greedy(server: Server, prompt: str, n: int = 16, **fields) -> dict:
    return server.completion(prompt, max_tokens=n, temperature=0, ignore_eos=True, **fields)


def sse_events(lines: list[str]) -> list[str]:
    """The payloads of an SSE stream: each event is one `data: ...` line and a blank line."""
    assert lines and all(line.startswith("data: ") for line in lines[::2]), lines
    assert all(line == "" for line in lines[1::2]), lines
    return [line[len("data: "):] for line in lines[::2]]


def stream_lines(server: Server, path: str, body: dict) -> list[str]:
    with server.http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(r.iter_lines())


# ----------------------------------------------------------------------------------------------
# Endpoints


def test_health(server):
    r = server.http.get("/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_models_names_the_model_directory_and_its_context(server):
    body = server.http.get("/v1/models").json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "tiny-qwen3"
    assert model["max_model_len"] == 4096
    assert [m.id for m in server.openai.models.list()] == ["tiny-qwen3"]


def test_completion_reports_length_and_usage(server, tokenizer):
    prompt = PROMPTS[0]
    body = greedy(server, prompt, n=8)
    assert body["object"] == "text_completion"
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["text"]
    prompt_tokens = len(tokenizer(prompt).input_ids)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 8,
                             "total_tokens": prompt_tokens + 8}


def test_completion_max_tokens_defaults_to_16(server):
    body = server.completion(PROMPTS[1], temperature=0, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 16


def test_completion_stream_is_sse_ending_in_done_and_joins_to_the_same_text(server):
    prompt = PROMPTS[1]
    events = sse_events(stream_lines(server, "/v1/completions", {
        "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        "length"]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == greedy(server, prompt, n=12)["choices"][0]["text"]


@pytest.fixture(scope="module")
def offline():
    """The offline engine of chapter 11, in this process, on the same checkpoint."""
    from minisgl.llm import LLM

    llm = LLM(str(MODEL), max_running_req=4, num_page_override=1024, max_seq_len_override=256)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_completion_equals_offline_llm(server, offline, prompt):
    from minisgl.core import SamplingParams

    [expected] = offline.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))
    assert greedy(server, prompt)["choices"][0]["text"] == expected["text"]


def chat_prompt_tokens(tokenizer, messages: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def test_chat_with_the_openai_client_stream_and_non_stream_agree(server, tokenizer):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."}]
    args = dict(model="tiny-qwen3", messages=messages, max_tokens=10, temperature=0,
                extra_body={"ignore_eos": True})
    whole = server.openai.chat.completions.create(**args)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length"
    prompt_tokens = chat_prompt_tokens(tokenizer, messages)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens,
            whole.usage.total_tokens) == (prompt_tokens, 10, prompt_tokens + 10)

    chunks = list(server.openai.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    first, *middle, last, usage = chunks
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    assert all(c.choices[0].delta.role is None for c in middle)
    assert "".join(c.choices[0].delta.content for c in middle) == whole.choices[0].message.content
    assert last.choices[0].finish_reason == "length" and not last.choices[0].delta.content
    assert usage.choices == [] and usage.usage == whole.usage
    assert {c.object for c in chunks} == {"chat.completion.chunk"}


def test_chat_stream_has_no_usage_chunk_unless_asked(server):
    chunks = list(server.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_chat_max_completion_tokens_is_max_tokens(server):
    r = server.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], temperature=0,
        max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5


def middle_word(text: str) -> str:
    """A piece from the middle of `text` that starts a word (so it is found there first)."""
    start = text.index(" ", len(text) // 3)
    return text[start : start + 4]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text_right_before_it(server, stream):
    prompt = PROMPTS[2]
    full = greedy(server, prompt, n=24)["choices"][0]["text"]
    stop = middle_word(full)
    expected = full[: full.index(stop)]
    assert 0 < len(expected) < len(full)
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "stop": [stop, "\x00not in the text"]}
    if stream:
        chunks = [json.loads(e) for e in sse_events(stream_lines(
            server, "/v1/completions", body))[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        r = server.completion(**body)
        text, finish = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
        assert r["usage"]["completion_tokens"] < 24
    assert (text, finish) == (expected, "stop")
    # The stop string aborted the request: it no longer runs and its pages are back.
    stats = server.idle_stats()
    assert stats["running"] == 0 and stats["free_pages"] + stats["cached_pages"] == \
        stats["num_pages"]


def test_stop_string_that_never_occurs_changes_nothing(server):
    full = greedy(server, PROMPTS[2], n=24)
    stopped = greedy(server, PROMPTS[2], n=24, stop="\x00never")
    assert stopped["choices"] == full["choices"]
    assert stopped["choices"][0]["finish_reason"] == "length"


def test_chat_without_max_tokens_fills_the_context(small, tokenizer):
    messages = [{"role": "user", "content": "Tell me a long story."}]
    r = small.openai.chat.completions.create(model="m", messages=messages, temperature=0)
    # tiny-qwen3 has random weights and does not say EOS here: the answer ends at the context.
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == chat_prompt_tokens(tokenizer, messages)
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 128


def test_max_tokens_that_fit_exactly_are_accepted(small, tokenizer):
    prompt = PROMPTS[0]
    room = 128 - len(tokenizer(prompt).input_ids)
    r = small.completion(prompt, max_tokens=room, temperature=0, ignore_eos=True)
    assert r["usage"]["total_tokens"] == 128


# ----------------------------------------------------------------------------------------------
# Errors: an OpenAI-style body, and the server keeps serving


BAD_REQUESTS = {
    "malformed JSON": ("/v1/completions", b'{"prompt": "x",', "not valid JSON"),
    "missing prompt": ("/v1/completions", {"max_tokens": 4}, "prompt"),
    "prompt not a string": ("/v1/completions", {"prompt": 5}, "prompt"),
    "messages empty": ("/v1/chat/completions", {"messages": []}, "messages"),
    "role invalid": ("/v1/chat/completions",
                     {"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    "max_tokens 0": ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    "max_tokens negative": ("/v1/completions", {"prompt": "x", "max_tokens": -3}, "max_tokens"),
    "max_tokens too large": ("/v1/completions", {"prompt": "x", "max_tokens": 4096},
                             "asks for up to 4,096 more; max_seq_len is 4,096"),
    "prompt longer than the context": ("/v1/completions",
                                       {"prompt": "hi " * 5000, "max_tokens": 8},
                                       "max_seq_len is 4,096"),
    "prompt too long, streaming": ("/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "hi " * 5000}],
                                    "max_tokens": 8, "stream": True}, "max_seq_len is 4,096"),
    "temperature negative": ("/v1/completions", {"prompt": "x", "temperature": -0.5},
                             "temperature"),
    "top_p 0": ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    "top_p 1.5": ("/v1/chat/completions",
                  {"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, "top_p"),
    "top_k 0": ("/v1/completions", {"prompt": "x", "top_k": 0}, "top_k"),
    # Once these crashed the scheduler (float32 made 2**63 - 1 negative) or were a 500
    # (msgpack cannot carry 2**64).
    "top_k 2**63-1": ("/v1/completions", {"prompt": "x", "top_k": 2**63 - 1},
                      "top_k must be -1 (no limit) or at most 2147483647"),
    "top_k 2**64": ("/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "x"}], "top_k": 2**64},
                    "top_k must be -1 (no limit) or at most 2147483647"),
    "n 2": ("/v1/completions", {"prompt": "x", "n": 2}, "n must be 1"),
    "presence_penalty": ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5},
                         "presence_penalty must be 0 or null"),
    "tools": ("/v1/chat/completions",
              {"messages": [{"role": "user", "content": "x"}],
               "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools must be"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_an_openai_400_and_the_server_keeps_serving(server, case):
    path, body, mentions = BAD_REQUESTS[case]
    if isinstance(body, bytes):
        r = server.http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = server.http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert mentions in error["message"] or mentions == error["param"], error
    assert {"message", "type", "param", "code"} <= error.keys()
    assert greedy(server, "still there?", n=2)["usage"]["completion_tokens"] == 2


def test_openai_client_raises_bad_request_error(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.openai.completions.create(model="m", prompt="x", max_tokens=1, top_p=1.5)
    assert "top_p" in e.value.body["message"]


UNSUPPORTED = [("n", 3), ("n", True), ("best_of", 2), ("logprobs", True), ("logprobs", 0),
               ("logprobs", 5), ("top_logprobs", 2), ("echo", True), ("suffix", " the end"),
               ("presence_penalty", 0.5), ("frequency_penalty", -1), ("logit_bias", {"42": 100}),
               ("seed", 7), ("response_format", {"type": "json_object"}),
               ("tools", [{"type": "function", "function": {"name": "f"}}]),
               ("tool_choice", "auto"), ("functions", [{"name": "f"}]), ("function_call", "auto"),
               ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"})]
NEUTRAL = {"n": 1, "best_of": 1, "logprobs": False, "top_logprobs": 0, "echo": False,
           "suffix": "", "presence_penalty": 0.0, "frequency_penalty": 0, "logit_bias": {},
           "seed": None, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
           "functions": None, "function_call": "none", "modalities": ["text"], "audio": None}


@pytest.mark.parametrize("field, value", UNSUPPORTED, ids=[f"{f}={v}" for f, v in UNSUPPORTED])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_an_unsupported_field_is_refused_by_name(field, value, chat):
    """Once silently ignored: a client asking for logprobs or a penalty got an answer without
    them and no sign of it."""
    from minisgl.server.protocol import APIError, ChatCompletionRequest, CompletionRequest

    body = (ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **{field: value})
            if chat else CompletionRequest(prompt="x", **{field: value}))
    with pytest.raises(APIError) as e:
        body.sampling_params(16)
    assert e.value.param == field and e.value.status == 400
    assert e.value.message.startswith(f"{field} must be ")
    assert e.value.message.endswith(f"got {json.dumps(value)}")


def test_the_neutral_values_of_unsupported_fields_are_accepted():
    from minisgl.server.protocol import CompletionRequest

    assert NEUTRAL.keys() == {field for field, _ in UNSUPPORTED}
    params, _ = CompletionRequest(prompt="x", max_tokens=3, **NEUTRAL).sampling_params(16)
    assert params.max_tokens == 3


def test_the_openai_client_may_send_the_neutral_values(server):
    r = server.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0,
        n=1, logprobs=False, presence_penalty=0, frequency_penalty=0, seed=None,
        response_format={"type": "text"}, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2


def test_unknown_path_is_an_openai_404(server):
    r = server.http.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


def test_stats_account_for_every_page(server):
    stats = server.idle_stats()
    assert {"num_pages", "free_pages", "cached_pages", "locked_pages", "running", "waiting",
            "rows_free"} <= stats.keys()
    assert stats["locked_pages"] == 0 and stats["running"] == stats["waiting"] == 0
    assert stats["free_pages"] + stats["cached_pages"] == stats["num_pages"]


# ----------------------------------------------------------------------------------------------
# Disconnects and concurrency


def disconnect_mid_stream(server: Server, prompt: str, events: int = 3) -> None:
    """Start a request that would run for minutes, read a few events, hang up."""
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={
                "prompt": prompt, "max_tokens": 4000, "ignore_eos": True, "temperature": 0,
                "stream": True}) as r:
            assert r.status_code == 200
            got = [line for _, line in zip(range(2 * events), r.iter_lines()) if line]
            assert len(got) == events


def assert_pages_come_back(server: Server, timeout: float = 5.0) -> None:
    # 4,000 tokens take far longer than `timeout`: running == 0 means it was aborted.
    deadline = time.monotonic() + timeout
    stats = server.stats()
    while stats["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = server.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0, stats
    assert stats["locked_pages"] == 0, stats
    assert stats["free_pages"] + stats["cached_pages"] == stats["num_pages"], stats


def test_client_that_disconnects_mid_stream_is_aborted_and_its_pages_freed(server):
    disconnect_mid_stream(server, "A story that never ends:")
    assert_pages_come_back(server)


def test_a_non_streaming_client_that_gives_up_is_aborted_too(server):
    with httpx.Client(base_url=server.url, timeout=1.5) as http:
        with pytest.raises(httpx.TimeoutException):
            http.post("/v1/completions", json={"prompt": "A story that never ends:",
                                               "max_tokens": 4000, "ignore_eos": True})
    assert_pages_come_back(server)


@pytest.fixture
def one_row():
    """A server that runs one request at a time: a second one waits for its first token."""
    yield from serve("--max-running-req", "1")


def test_a_client_that_leaves_before_its_first_token_is_aborted_in_the_queue(one_row):
    with httpx.Client(base_url=one_row.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={
                "prompt": "A story that never ends:", "max_tokens": 4000, "ignore_eos": True,
                "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()  # kept: dropping the iterator would close the stream
            next(lines)  # it runs: it holds the only row
            with httpx.Client(base_url=one_row.url, timeout=1.5) as impatient:
                with pytest.raises(httpx.TimeoutException):
                    impatient.post("/v1/completions", json={"prompt": "Me too:", "max_tokens": 8})
            # Noticed while it still waits for a row, not once the first request ends.
            deadline = time.monotonic() + 5.0
            while one_row.stats()["waiting"] and time.monotonic() < deadline:
                time.sleep(0.1)
            stats = one_row.stats()
            assert (stats["running"], stats["waiting"]) == (1, 0), stats
    assert_pages_come_back(one_row)


def test_eight_concurrent_requests_each_equal_the_request_alone(server):
    alone = [greedy(server, p, n=10)["choices"][0]["text"] for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: greedy(server, p, n=10)["choices"][0]["text"],
                                 PROMPTS))
    assert together == alone


def test_two_tokenizers_give_the_same_outputs(server, server2):
    assert len(server2.workers) == len(server.workers) + 2  # +1 tokenizer, +1 detokenizer
    for prompt in PROMPTS[:4]:  # uids alternate, so both tokenizers take part
        assert greedy(server2, prompt, n=8)["choices"] == greedy(server, prompt, n=8)["choices"]
    messages = [{"role": "user", "content": "Hello"}]
    chat = [s.openai.chat.completions.create(model="m", messages=messages, max_tokens=8,
                                             temperature=0).choices[0].message.content
            for s in (server, server2)]
    assert chat[0] == chat[1]


def test_two_tokenizers_still_abort_and_free_pages(server2):
    for prompt in ["A first story:", "A second story:"]:  # consecutive uids: one abort
        disconnect_mid_stream(server2, prompt)           # through each tokenizer
    assert_pages_come_back(server2)


# ----------------------------------------------------------------------------------------------
# The frontend and a request's first reply, in this process


def test_a_request_msgpack_cannot_carry_leaves_no_uid_waiting():
    from minisgl.core import SamplingParams
    from minisgl.server.frontend import Frontend
    from minisgl.utils.zmq_queue import ipc_address, new_run_id

    run_id = new_run_id()
    frontend = Frontend([ipc_address(run_id, "tokenizer")], ipc_address(run_id, "frontend"))
    try:
        with pytest.raises(OverflowError):
            frontend.submit("x", SamplingParams(temperature=1.0, top_k=2**64))
        assert frontend.waiting == {}
    finally:
        frontend.close()


class RecordingFrontend:
    """What Generation asks of the Frontend, written down."""

    failure: str | None = None  # what Generation reads: the server has not failed

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def abort(self, uid: int) -> None:
        self.calls.append(("abort", uid))

    def done(self, uid: int) -> None:
        self.calls.append(("done", uid))


def test_waiting_for_the_first_reply_aborts_when_cancelled():
    from minisgl.server.api_server import Generation

    async def cancel_while_waiting() -> list[tuple[str, int]]:
        frontend = RecordingFrontend()
        gen = Generation(frontend, 7, asyncio.Queue(), [])  # type: ignore[arg-type]
        task = asyncio.create_task(gen.wait_first(lambda: asyncio.sleep(0, result=False)))
        await asyncio.sleep(0.05)
        task.cancel()  # as uvicorn's graceful shutdown does once its timeout is over
        with pytest.raises(asyncio.CancelledError):
            await task
        return frontend.calls

    assert asyncio.run(cancel_while_waiting()) == [("abort", 7)]


def test_a_client_gone_before_the_first_reply_is_noticed_and_aborted(monkeypatch):
    from minisgl.server import api_server

    monkeypatch.setattr(api_server, "CHECK_CLIENT_S", 0.01)
    frontend = RecordingFrontend()
    gen = api_server.Generation(frontend, 7, asyncio.Queue(), [])  # type: ignore[arg-type]
    with pytest.raises(api_server.APIError) as info:
        asyncio.run(gen.wait_first(lambda: asyncio.sleep(0, result=True)))
    assert info.value.status == 499 and "disconnected" in info.value.message
    assert frontend.calls == [("abort", 7)]


class QueuedFrontend(RecordingFrontend):
    """A Frontend whose every request has `replies` queued already."""

    def __init__(self, replies: list) -> None:
        super().__init__()
        self.replies = replies

    def submit(self, prompt, params, fit_to_context=False) -> tuple[int, asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue()
        for reply in self.replies:
            queue.put_nowait(reply)
        return 7, queue


def asgi_post(app, path: str, body: dict, send_fails_at: int) -> list[dict]:
    """POST `body` to the app in this process; the client's socket breaks at the
    `send_fails_at`-th body chunk (OSError, as uvicorn's writes raise). The messages sent."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            if sum(m["type"] == "http.response.body" for m in sent) + 1 == send_fails_at:
                raise OSError("the client has gone")
        sent.append(message)

    async def call() -> None:
        try:
            await app(scope, receive, send)
        except Exception:  # noqa: BLE001 - the broken socket surfaces here, as in uvicorn
            pass

    asyncio.run(call())
    return sent


@pytest.mark.parametrize("chunk", [1, 2], ids=["role-chunk", "first-text-chunk"])
def test_a_streaming_client_that_leaves_early_frees_its_request(chunk):
    from minisgl.message import UserReply
    from minisgl.server.api_server import create_app

    frontend = QueuedFrontend([UserReply(7, " Paris", False, prompt_tokens=3)])
    app = create_app(frontend, "m", 128)  # type: ignore[arg-type]
    asgi_post(app, "/v1/chat/completions",
              {"messages": [{"role": "user", "content": "x"}], "stream": True}, chunk)
    # The first reply was read (wait_first); no more came: the request must be aborted.
    assert ("abort", 7) in frontend.calls, frontend.calls


# ----------------------------------------------------------------------------------------------
# The shell


def test_shell_answers_resets_and_exits(small):
    # The same greedy answer as the HTTP chat on a server with the same context.
    expected = small.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}], temperature=0)
    shell = Process("--model", str(MODEL), "--shell", "--max-seq-len", "128", stdin=True)
    try:
        shell.wait_for("/reset")  # the help line: the backend is up
        shell.workers = workers_of(shell.pid)
        shell.children = descendants_of(shell.pid)
        assert shell.popen.stdin is not None
        shell.popen.stdin.write("Hello\n/reset\n/exit\n")
        shell.popen.stdin.flush()
        code = shell.popen.wait(timeout=60)
    finally:
        if shell.popen.poll() is None:
            shell.stop(signal.SIGKILL)
    shell.reader.join(5)
    assert_stopped_cleanly(shell, code)
    assert len(shell.workers) >= 2
    assert expected.choices[0].message.content in shell.output
    assert "(conversation cleared)" in shell.output


def threads_taking(pid: int, sig: int) -> list[int]:
    """The threads of `pid` other than its main thread that do not block `sig`: the kernel may
    hand a signal sent to the process to any of them."""
    found = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
        status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
                      if ":\t" in line)
        if int(task.name) != pid and not int(status["SigBlk"], 16) >> (sig - 1) & 1:
            found.append(int(task.name))
    return found


@pytest.mark.parametrize("target", ["process", "another-thread"])
def test_shell_ctrl_c_at_the_prompt_exits_at_once(target):
    # Nothing typed, stdin left open: the shell waits at its prompt like an idle terminal.
    shell = Process("--model", str(MODEL), "--shell", "--max-seq-len", "128", stdin=True)
    try:
        shell.wait_for("/reset")  # the help line: the backend is up, the prompt comes next
        shell.workers = workers_of(shell.pid)
        shell.children = descendants_of(shell.pid)
        time.sleep(0.5)  # now it is blocked reading stdin
        if target == "process":
            code = shell.stop(signal.SIGINT)  # fails if it has not exited within STOP_TIMEOUT
        else:
            # A signal sent to the process may land on any thread that does not block it (the
            # stdin reader, the frontend's listener), while the main thread sleeps in epoll_wait.
            [*_, thread] = threads_taking(shell.pid, signal.SIGINT)
            assert ctypes.CDLL(None, use_errno=True).tgkill(shell.pid, thread, signal.SIGINT) == 0
            code = shell.wait(STOP_TIMEOUT)
    finally:
        if shell.popen.poll() is None:
            shell.stop(signal.SIGKILL)
    assert_stopped_cleanly(shell, code)
    assert len(shell.workers) >= 2
    assert "Traceback" not in shell.output, shell.output


# ----------------------------------------------------------------------------------------------
# Launcher errors: caught before anything is loaded


def run_minisgl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minisgl", *args], cwd=ROOT, env=minisgl_env(),
                          capture_output=True, text=True, timeout=120)


def test_missing_model_exits_2_with_a_clear_message(tmp_path):
    r = run_minisgl("--model", str(tmp_path / "no-such-model"))
    assert r.returncode == 2
    assert "no-such-model" in r.stderr and "config.json" in r.stderr
    assert "loading" not in r.stdout


def test_busy_port_exits_2_naming_the_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_minisgl("--model", str(MODEL), "--port", str(port))
    assert r.returncode == 2
    assert f"port {port}" in r.stderr and "in use" in r.stderr
    assert "loading" not in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port must be between 0 and 65535, got 70000"),
    (["--num-pages", "0"], "num_page_override must be >= 1, got 0"),
    (["--max-seq-len", "-1"], "max_seq_len_override must be >= 1, got -1"),
])
def test_out_of_range_option_exits_2_naming_the_value(args, message):
    port = [] if "--port" in args else ["--port", "0"]  # 1919 may be in use
    r = run_minisgl("--model", str(MODEL), *args, *port)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert "loading" not in r.stdout


def parse_error(capsys, *args: str) -> str:
    """What parse_args says before it exits 2 (in this process: nothing is started)."""
    from minisgl.server.args import parse_args

    with pytest.raises(SystemExit) as info:
        parse_args(["--model", str(MODEL), *args])
    assert info.value.code == 2
    return capsys.readouterr().err


def test_an_ipv6_host_is_checked_with_an_ipv6_socket(capsys):
    from minisgl.server.args import parse_args

    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        s.listen()
        port = s.getsockname()[1]
        assert f"port {port} on ::1 is in use" in parse_error(capsys, "--host", "::1",
                                                               "--port", str(port))
    assert parse_args(["--model", str(MODEL), "--host", "::1", "--port", str(port)]).host == "::1"


def test_the_url_of_an_ipv6_host_has_brackets():
    from minisgl.server.launch import http_url

    assert http_url("::", 1919) == "http://[::]:1919"  # once http://:::1919
    assert http_url("::1", 80) == "http://[::1]:80"
    assert http_url("127.0.0.1", 1919) == "http://127.0.0.1:1919"
    assert http_url("localhost", 1919) == "http://localhost:1919"


def test_the_ready_line_of_an_ipv6_server_is_a_url_that_answers():
    """--port 0 too: the line names the port the system chose, not 0."""
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
    proc = Process("--model", str(MODEL), "--host", "::1", "--port", "0", "--max-seq-len", "128")
    try:
        url = proc.served_url()
        children = descendants_of(proc.pid)
        assert url.startswith("http://[::1]:") and not url.endswith(":0"), proc.output
        assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok"}
    finally:
        code = proc.stop()
    proc.children = children
    assert_stopped_cleanly(proc, code)


def test_a_host_that_cannot_be_listened_on_is_not_called_a_busy_port(capsys):
    # 203.0.113.1 is a documentation address (RFC 5737): no interface here has it.
    err = parse_error(capsys, "--host", "203.0.113.1", "--port", "0")
    assert "cannot listen on 203.0.113.1" in err and "in use" not in err
    err = parse_error(capsys, "--host", "no-such-host.invalid")
    assert "--host no-such-host.invalid:" in err and "in use" not in err


def test_help_lists_the_options():
    r = run_minisgl("--help")
    assert r.returncode == 0
    for option in ["--model", "--host", "--port", "--num-tokenizer", "--cache-type",
                   "--page-size", "--max-running-req", "--max-seq-len", "--shell"]:
        assert option in r.stdout, option


# ----------------------------------------------------------------------------------------------
# Shutdown (last: the first two stop the servers of the fixtures above)


def test_sigint_stops_the_server_and_all_its_children(server):
    assert len(server.workers) >= 2  # the scheduler and the tokenizer, at least
    assert server.socket_files()
    assert_stopped_cleanly(server, server.shut_down(signal.SIGINT))


def test_sigterm_stops_the_server_and_all_its_children(small):
    assert_stopped_cleanly(small, small.shut_down(signal.SIGTERM))


def test_children_exit_on_their_own_when_the_server_is_killed():
    server = Server()
    try:
        assert len(server.workers) >= 2
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        # Nobody stops them: each child sees its parent gone and exits.
        assert not wait_all_gone(server.children, timeout=10.0)
    finally:
        for path in server.socket_files():  # a killed launcher cannot clean up
            os.unlink(path)


def test_sigterm_while_loading_stops_cleanly(tmp_path):
    proc = Process("--model", str(model_that_never_loads(MODEL, tmp_path)), "--port", "0")
    try:
        proc.wait_for("minisgl: loading")
        deadline = time.monotonic() + 60
        while len(workers_of(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the scheduler and the tokenizer
        proc.children = descendants_of(proc.pid)
        assert len(workers_of(proc.pid)) >= 2
        code = proc.stop(signal.SIGTERM)
    finally:
        if proc.popen.poll() is None:
            proc.stop(signal.SIGKILL)
    assert "ready" not in proc.output
    assert "interrupted while loading" in proc.output
    assert code == 130  # like Ctrl-C
    assert not wait_all_gone(proc.children, timeout=5.0)
    assert not proc.socket_files()


# --- the chapter's example ---

from conftest import MODELS_DIR, SMOLLM2  # noqa: E402
from processes import run_example  # noqa: E402


def test_example_streams_transformers_greedy_answer_and_stops_on_ctrl_c(hf_model, hf_tokenizer,
                                                                         hf_greedy):
    out = run_example("ch15_api_server.py", timeout=600)
    assert "[服务] minisgl: ready" in out
    tokenizer = hf_tokenizer(SMOLLM2)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer(tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                     tokenize=False),
                       add_special_tokens=False).input_ids
    eos = json.loads((MODELS_DIR / SMOLLM2 / "generation_config.json").read_text())["eos_token_id"]
    answer = hf_greedy(hf_model(SMOLLM2), prompt, 48)  # temperature=0, max_tokens=48
    answer = answer[: answer.index(eos) + 1] if eos in answer else answer
    text = tokenizer.decode(answer, skip_special_tokens=True)
    assert f"回答：{text}\n用量：提示词 {len(prompt)} 个 token，回答 {len(answer)} 个\n" in out
    assert "[服务] minisgl: stopped" in out and out.rstrip().endswith("退出码 0")
