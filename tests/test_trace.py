"""Chapter 21: `--trace FILE`, a Chrome trace of every process of a server on one clock.

One real server (SmolLM2 on the CPU) serves three streaming chats at once and a fourth whose
client hangs up after its first chunk; then it stops and merges the trace. The tests read
that trace as a reader's Perfetto would and check the journey of each request (chapter 0's
① … ⑫), the counts that must agree, and the abort. The merge and the off switch are unit
tests; `LLM(..., trace=FILE)` gets one run of its own.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections import Counter, defaultdict

import httpx
import pytest

from processes import ROOT, Child

CHAPTER = 21  # tools/steps.py check runs this module on chapter 21's own tree

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
MAX_TOKENS = 4
QUESTIONS = ["What is the capital of France?", "What is the capital of Italy?", "Name a color."]
LANES = {"api-server", "tokenizer-0", "scheduler-rank0"}
# Who receives what a process sends (chapter 0's process diagram).
RECEIVER = {
    **{("api-server", m): "tokenizer-0" for m in ("TokenizeMsg", "AbortMsg", "StatsMsg")},
    **{("tokenizer-0", m): "scheduler-rank0" for m in ("UserMsg", "AbortMsg", "StatsMsg")},
    **{("tokenizer-0", m): "api-server" for m in ("UserReply", "StatsReply")},
    **{("scheduler-rank0", m): "tokenizer-0" for m in ("DetokenizeMsg", "StatsReply")}}
# Chapter 0's journey: (process, event, direction) in the order each request must meet them.
JOURNEY = [("api-server", "http_request", None), ("api-server", "TokenizeMsg", "send"),
           ("tokenizer-0", "TokenizeMsg", "recv"), ("tokenizer-0", "UserMsg", "send"),
           ("scheduler-rank0", "UserMsg", "recv"), ("scheduler-rank0", "queued", None),
           ("scheduler-rank0", "admit", None), ("scheduler-rank0", "prefill", None),
           ("scheduler-rank0", "DetokenizeMsg", "send"), ("tokenizer-0", "DetokenizeMsg", "recv"),
           ("tokenizer-0", "UserReply", "send"), ("api-server", "UserReply", "recv"),
           ("api-server", "sse_write", None), ("scheduler-rank0", "finish", None),
           ("api-server", "http_done", None)]


def _chat(url: str, content: str, max_tokens: int, hang_up_after: int | None = None,
          first_token: threading.Event | None = None) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": True,
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    chunks = 0
    with httpx.stream("POST", url, json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            chunks += line.startswith("data: {")
            if first_token is not None and chunks == 2:  # the role's chunk, then a token's
                first_token.set()
            if chunks == hang_up_after:
                return  # leaving the block closes the connection: the client is gone


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("trace") / "run.json"
    server = Child([sys.executable, "-m", "minisgl", "--model", str(MODEL), "--port", "0",
                    "--trace", str(path), "--num-pages", "1024", "--max-seq-len", "256",
                    "--max-running-req", "8"])
    try:
        base = server.served_url()
        url = f"{base}/v1/chat/completions"
        # The first request alone, so that its prompt is in the prefix cache when the others
        # arrive together: they share its system prompt.
        first_token = threading.Event()
        clients = [threading.Thread(target=_chat, args=(url, QUESTIONS[0], MAX_TOKENS, None,
                                                        first_token))]
        clients[0].start()
        assert first_token.wait(timeout=300)
        clients += [threading.Thread(target=_chat, args=(url, q, MAX_TOKENS)) for q in QUESTIONS[1:]]
        # Two chunks: the role's, then the first token's. Far from its 64 tokens.
        clients.append(threading.Thread(target=_chat, args=(url, "Tell me a story.", 64, 2)))
        for c in clients[1:]:
            c.start()
        for c in clients:
            c.join()
        # The abort crosses two processes; a finished request shows in /stats as not running.
        for _ in range(100):
            if httpx.get(f"{base}/stats").json()["running"] == 0:
                break
            threading.Event().wait(0.1)
    finally:
        code = server.stop(signal.SIGTERM, timeout=60)
    assert code == 0, server.output
    assert f"trace events in {path}" in server.output
    assert not path.with_name(path.name + ".parts").exists()
    return json.loads(path.read_text())


def _by_process(trace: dict) -> tuple[dict[int, str], list[dict]]:
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    return names, [e for e in trace["traceEvents"] if e["ph"] in ("i", "X")]


def _uids_of(trace: dict) -> tuple[list[int], int]:
    """The uids that ran to the end, and the one whose client hung up."""
    _, events = _by_process(trace)
    aborted = [e["args"]["uid"] for e in events if e["name"] == "abort"]
    assert len(aborted) == 1, "the client that hung up was not aborted"
    done = sorted({e["args"]["uid"] for e in events if e["name"] == "http_done"})
    return done, aborted[0]


def test_every_process_is_a_named_lane_on_one_clock(trace):
    names, events = _by_process(trace)
    assert set(names.values()) == LANES
    assert {names[e["pid"]] for e in events} == LANES
    thread_names = [e for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert {e["pid"] for e in thread_names} == set(names)
    # One clock: the k-th copy of a message reaches a process after its k-th sending to it.
    sent, received = defaultdict(list), defaultdict(list)
    for e in events:
        name, uid, lane = e["name"], e["args"].get("uid"), names[e["pid"]]
        if e["args"].get("dir") == "send":
            sent[name, uid, RECEIVER[lane, name]].append(e["ts"])
        elif e["args"].get("dir") == "recv":
            received[name, uid, lane].append(e["ts"])
    assert set(sent) == set(received)
    for key, times in received.items():
        assert len(times) == len(sent[key]), key
        assert all(r >= s for s, r in zip(sent[key], times)), key


def test_every_message_is_an_arrow_from_its_send_to_its_receipt(trace):
    names, _ = _by_process(trace)
    events = trace["traceEvents"]
    ends = defaultdict(list)
    for e in events:
        if e["ph"] == "f":
            ends[e["cat"], e["name"], e["id"]].append(e)
    starts = [e for e in events if e["ph"] == "s"]
    sends = [e for e in events if e["ph"] == "i" and e["args"].get("dir") == "send"]
    assert len(starts) == len(sends) > 0
    # Each arrow sits on its message's own event: same process, thread, time and name.
    messages = {(e["pid"], e["tid"], e["ts"], e["name"], e["args"]["dir"]) for e in events
                if e["ph"] == "i" and "dir" in e["args"]}
    for s in starts:
        (f,) = ends.pop((s["cat"], s["name"], s["id"]))  # exactly one receipt
        sender, receiver = names[s["pid"]], names[f["pid"]]
        assert receiver == RECEIVER[sender, s["name"]] and f["ts"] > s["ts"], (s, f)
        assert f["bp"] == "e"  # bound to the receipt's event, not to the next slice
        assert (s["pid"], s["tid"], s["ts"], s["name"], "send") in messages
        assert (f["pid"], f["tid"], f["ts"], f["name"], "recv") in messages
    assert not ends, f"receipts nobody sent: {list(ends)}"


def test_each_request_meets_the_journey_in_order(trace):
    names, events = _by_process(trace)
    done, _ = _uids_of(trace)
    assert len(done) == len(QUESTIONS)
    for uid in done:
        times = []
        for lane, name, direction in JOURNEY:
            matches = [e["ts"] for e in events if names[e["pid"]] == lane and e["name"] == name
                       and e["args"].get("dir") == direction
                       and uid in (e["args"].get("uids") or [e["args"].get("uid")])]
            assert matches, f"uid {uid}: no {name} ({direction}) in {lane}"
            times.append(min(matches))
        assert times == sorted(times), f"uid {uid}: {list(zip([j[1] for j in JOURNEY], times))}"


def test_every_step_of_a_request_gives_it_one_token(trace):
    # Its prompt fits one step; after that it takes one token per step, whether the step is a
    # decode or a prefill of other requests that it rides in (chapter 10's mixed batch).
    names, events = _by_process(trace)
    done, _ = _uids_of(trace)
    tokens = Counter(e["args"]["uid"] for e in events if e["name"] == "DetokenizeMsg"
                     and e["args"]["dir"] == "send")
    steps = Counter(u for e in events if e["name"] in ("prefill", "decode")
                    for u in e["args"]["uids"])
    for uid in done:
        assert tokens[uid] == MAX_TOKENS
        assert steps[uid] == MAX_TOKENS


def test_every_page_allocated_is_returned_to_the_cache_or_freed(trace):
    _, events = _by_process(trace)
    done, aborted = _uids_of(trace)
    allocated, returned = Counter(), Counter()
    for e in events:
        if e["name"] in ("prefill", "decode"):
            for uid, pages in zip(e["args"]["uids"], e["args"]["pages"]):
                allocated[uid] += pages
        elif e["name"] == "pages_returned":
            returned[e["args"]["uid"]] += e["args"]["to_cache"] + e["args"]["freed"]
    for uid in [*done, aborted]:
        assert allocated[uid] > 0 and allocated[uid] == returned[uid], uid


def test_every_request_is_admitted_once(trace):
    # A running request riding in a prefill step (chapter 10's mixed batch) is not admitted
    # again, even when its cached length equals the prefix it locked after its prompt.
    _, events = _by_process(trace)
    queued = sorted(e["args"]["uid"] for e in events if e["name"] == "queued")
    assert sorted(e["args"]["uid"] for e in events if e["name"] == "admit") == queued


def test_the_shared_prompt_prefix_is_a_radix_hit(trace):
    _, events = _by_process(trace)
    hits = [e["args"]["hit"] for e in events if e["name"] == "admit"]
    # Every chat starts with the same system prompt: only the first, admitted alone, misses.
    assert hits[0] == 0 and all(h > 0 for h in hits[1:]), hits


def test_a_client_that_hangs_up_is_aborted_in_every_process(trace):
    names, events = _by_process(trace)
    _, uid = _uids_of(trace)
    where = [(names[e["pid"]], e["name"], e["args"].get("dir")) for e in events
             if e["args"].get("uid") == uid and e["name"] in ("AbortMsg", "abort", "finish")]
    assert where == [("api-server", "AbortMsg", "send"), ("tokenizer-0", "AbortMsg", "recv"),
                     ("tokenizer-0", "AbortMsg", "send"), ("scheduler-rank0", "AbortMsg", "recv"),
                     ("scheduler-rank0", "abort", None), ("scheduler-rank0", "finish", None)]


# ---------------------------------------------------------------------------------- unit tests


def test_merge_keeps_every_whole_line_of_a_process_killed_mid_write(tmp_path):
    from minisgl.utils import trace

    parts = tmp_path / "run.json.parts"
    parts.mkdir()
    (parts / "1.jsonl").write_text(
        '{"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"a"}}\n'
        '{"ph":"i","name":"x","pid":1,"tid":1,"ts":2.0,"args":{}}\n')
    (parts / "2.jsonl").write_text(  # killed while writing its third line
        '{"ph":"i","name":"y","pid":2,"tid":2,"ts":1.0,"args":{}}\n'
        '{"ph":"X","name":"z","pid":2,"tid":2,"ts":3.0,"dur":1.0,"args":{}}\n'
        '{"ph":"i","name":"cut')
    assert trace.merge(parts, tmp_path / "run.json") == 4
    merged = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert [e["name"] for e in merged] == ["process_name", "y", "x", "z"]


def test_tracing_off_writes_nothing(tmp_path, monkeypatch):
    from minisgl.utils import trace

    monkeypatch.chdir(tmp_path)
    assert not trace.enabled()  # nobody called begin() in this process
    trace.instant("queued", uid=1)
    trace.span("decode", trace.now(), uids=[1])
    trace.messages("send", [object()], "ipc:///nowhere")
    assert list(tmp_path.iterdir()) == []


def test_llm_trace_records_every_step(tmp_path):
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    path = tmp_path / "llm.json"
    llm = LLM(str(MODEL), dtype=torch.float32, max_running_req=4, num_page_override=512,
              max_seq_len_override=128, trace=str(path))
    try:
        llm.generate(["The capital of France is", "The capital of Italy is"],
                     SamplingParams(max_tokens=3, ignore_eos=True))
    finally:
        llm.shutdown()
    events = json.loads(path.read_text())["traceEvents"]
    steps = [e for e in events if e["name"] in ("prefill", "decode")]
    assert [e["name"] for e in steps][0] == "prefill"
    assert Counter(u for e in steps if e["name"] == "decode" for u in e["args"]["uids"]) == \
        {0: 2, 1: 2}
    assert not path.with_name("llm.json.parts").exists()


def test_a_request_riding_in_a_prefill_step_is_not_admitted_again(tmp_path):
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    # The second prompt shares 40+ tokens with the first: it waits a step for them to be
    # cached, and the first then rides in its prefill (chapter 10's mixed batch) with a cached
    # length equal to the prefix it locked when its prompt was done (page size 1).
    shared = "In the beginning the universe was created. " * 6
    path = tmp_path / "llm.json"
    llm = LLM(str(MODEL), dtype=torch.float32, max_running_req=4, num_page_override=512,
              max_seq_len_override=256, page_size=1, trace=str(path))
    try:
        llm.generate([shared + "Yes", shared + "No"], SamplingParams(max_tokens=3, ignore_eos=True))
    finally:
        llm.shutdown()
    events = json.loads(path.read_text())["traceEvents"]
    steps = [e["args"]["uids"] for e in events if e["name"] in ("prefill", "decode")]
    assert steps[:2] == [[0], [0, 1]]
    assert sorted(e["args"]["uid"] for e in events if e["name"] == "admit") == [0, 1]


def test_a_trace_file_in_a_missing_directory_is_refused_before_loading(tmp_path, capsys):
    from minisgl.server.args import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", str(MODEL), "--shell", "--trace", str(tmp_path / "no" / "t.json")])
    assert f"--trace {tmp_path / 'no' / 't.json'}: its directory does not exist" in \
        capsys.readouterr().err
