"""benchmark/online.py: its pure parts (arrivals, statistics, workloads) and one small run
against a real server (tiny-qwen3 on the CPU)."""

from __future__ import annotations

import json
import math
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image
from transformers import AutoTokenizer

from benchmark_scripts import load_script
from processes import START_TIMEOUT

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-qwen3"


online = load_script("online")
WORDS = [f" w{chr(97 + i)}{chr(97 + j)}" for i in range(26) for j in range(26)]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY)


# ----------------------------------------------------------------------------------------------
# Arrivals


def test_arrivals_are_seeded_exponential_gaps():
    times = online.arrival_times(4000, 4.0, seed=1)
    assert times == online.arrival_times(4000, 4.0, seed=1)
    assert times != online.arrival_times(4000, 4.0, seed=2)
    assert times[0] == 0.0
    gaps = np.diff(times)
    assert (gaps > 0).all()
    # Exponential with mean 1/rate: mean and standard deviation both 0.25 (within ~5 sigma).
    assert gaps.mean() == pytest.approx(0.25, rel=0.08)
    assert gaps.std() == pytest.approx(0.25, rel=0.15)


def test_arrivals_scale_with_the_rate_and_inf_sends_everything_at_once():
    slow, fast = online.arrival_times(50, 1.0, seed=0), online.arrival_times(50, 4.0, seed=0)
    assert fast == pytest.approx([t / 4 for t in slow])
    assert online.arrival_times(5, math.inf, seed=0) == [0.0] * 5
    with pytest.raises(ValueError):
        online.arrival_times(5, 0.0, seed=0)


# ----------------------------------------------------------------------------------------------
# Statistics


def test_percentile_interpolates_like_numpy():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        values = [rng.uniform(0, 100) for _ in range(n)]
        for p in (0, 50, 90, 99, 100):
            assert online.percentile(values, p) == pytest.approx(np.percentile(values, p))
    with pytest.raises(ValueError):
        online.percentile([], 50)


def test_summary_counts_completed_requests_and_pools_the_gaps():
    def result(i, ttft, e2e, itl, tokens, ok=True):
        return online.Result(i, ok=ok, requested_tokens=tokens, prompt_tokens=10,
                             output_tokens=tokens if ok else 0, ttft=ttft, e2e=e2e, itl=itl)

    results = [result(0, 0.1, 0.5, [0.2, 0.2], 3), result(1, 0.3, 0.7, [0.4], 2),
               result(2, 0, 0, [], 4, ok=False)]
    s = online.summarize(results, duration=2.0)
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["request_throughput"] == 1.0
    assert s["output_throughput"] == 2.5
    assert (s["prompt_tokens"], s["output_tokens"]) == (20, 5)
    assert s["exact_output_lengths"]
    assert s["ttft_ms"]["p50"] == pytest.approx(200)
    assert s["ttft_ms"]["mean"] == pytest.approx(200)
    assert s["e2e_ms"]["p90"] == pytest.approx(np.percentile([500, 700], 90))
    assert s["itl_ms"]["p50"] == pytest.approx(200)  # the gaps 200, 200, 400 together
    assert s["itl_ms"]["mean"] == pytest.approx(800 / 3)
    assert s["tpot_ms"]["mean"] == pytest.approx((200 + 400) / 2)
    empty = online.summarize([result(0, 0.1, 0.1, [], 1)], duration=1.0)["itl_ms"]
    assert empty == {"mean": None, "p50": None, "p90": None, "p99": None}


# ----------------------------------------------------------------------------------------------
# Workloads


def test_random_workload_lengths_are_seeded_and_texts_change_per_round(tokenizer):
    words = online.single_token_words(tokenizer)
    a = online.random_workload(words, 20, 64, 16, 0.5, seed=3, round_=0)
    b = online.random_workload(words, 20, 64, 16, 0.5, seed=3, round_=1)
    assert [r.output_len for r in a] == [r.output_len for r in b]
    # Exactly the drawn number of tokens, in every round: words of one token each.
    drawn = online.draw_lengths(random.Random(3), 20, 64, 0.5)
    assert all(32 <= n <= 64 for n in drawn)
    assert [len(online.prompt_ids(tokenizer, r)) for r in a] == drawn
    assert [len(online.prompt_ids(tokenizer, r)) for r in b] == drawn
    assert all(8 <= r.output_len <= 16 for r in a)
    assert all(x.prompt != y.prompt for x, y in zip(a, b))
    assert [r.prompt for r in a] == [r.prompt for r in
                                     online.random_workload(words, 20, 64, 16, 0.5, 3, 0)]
    assert all(r.after is None for r in a)


def test_shared_prefix_workload_is_turn_major_chats_on_one_system_prompt():
    users, turns = 3, 3
    reqs = online.shared_prefix_workload(WORDS, users, turns, system_len=50, turn_len=5,
                                         output_len=7, seed=0)
    assert len(reqs) == users * turns
    system = reqs[0].prompt[0]
    assert system["role"] == "system" and len(system["content"].split()) == 50
    for i, r in enumerate(reqs):
        turn = i // users
        assert r.output_len == 7
        assert r.prompt[0] == system
        assert [m["role"] for m in r.prompt] == ["system"] + ["user", "assistant"] * turn + ["user"]
        assert r.prompt[-1]["role"] == "user" and len(r.prompt[-1]["content"].split()) == 5
        if turn == 0:
            assert r.after is None
        else:  # the previous turn of the same user, whose messages this one extends
            assert r.after == i - users
            assert r.prompt[:len(reqs[r.after].prompt)] == reqs[r.after].prompt
            assert len(r.prompt[-2]["content"].split()) == 7  # its (fixed) answer
    assert len({r.prompt[1]["content"] for r in reqs[:users]}) == users  # users differ
    again = online.shared_prefix_workload(WORDS, users, turns, 50, 5, 7, seed=0)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]
    other_round = online.shared_prefix_workload(WORDS, users, turns, 50, 5, 7, seed=0, round_=1)
    assert other_round[0].prompt[0] != system


def test_reusable_tokens_count_the_shared_prefixes(tokenizer):
    words = online.single_token_words(tokenizer)
    reqs = online.shared_prefix_workload(words, 2, 2, system_len=40, turn_len=4,
                                         output_len=3, seed=0)
    ids = [online.prompt_ids(tokenizer, r) for r in reqs]
    shared = online.reusable_tokens(ids, reqs)
    assert shared[0] == 0
    assert 40 <= shared[1] < len(ids[1])  # at least the system prompt, not the question
    for i in (2, 3):  # a second turn shares its whole previous prompt
        assert shared[i] == len(ids[i - 2])


# ----------------------------------------------------------------------------------------------
# Plot


def test_the_plot_draws_a_report_as_json_holds_it(tmp_path):
    def run(round_, rate, cache, ms):
        figures = {"p50": ms, "p90": 2 * ms, "p99": 3 * ms}
        return {"round": round_, "rate": rate, "cache_type": cache, "ttft_ms": figures,
                "itl_ms": figures if rate != "inf" else {"p50": None, "p90": None, "p99": None},
                "e2e_ms": {p: 100 * v for p, v in figures.items()}}

    runs = [run(i, rate, cache, (i + 1) * (2 if cache == "naive" else 1))
            for cache in ("radix", "naive") for i, rate in enumerate([1.0, 4.0, "inf"])]
    report = json.loads(json.dumps({"model": "tiny-qwen3", "workload": "shared-prefix",
                                    "runs": runs}))  # "inf" as --json writes it
    path = tmp_path / "online.png"
    online.plot(report, str(path))
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    height, width, _ = image.imread(path).shape
    assert height > 100 and width > 100


# ----------------------------------------------------------------------------------------------
# One real run


def processes_with_environ(entry: str) -> list[int]:
    """Every process but this one whose environment holds `entry` ("NAME=value")."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def test_a_small_run_completes_every_request_and_stops_its_server(tmp_path, capsys,
                                                                  monkeypatch):
    # The server and its children inherit this mark; no other test's processes have it.
    mark = f"MINISGL_TEST_RUN={tmp_path.name}-{os.getpid()}"
    monkeypatch.setenv(*mark.split("=", 1))
    out = tmp_path / "online.json"
    code = online.main(["--model", str(TINY), "--num-requests", "5", "--rates", "20",
                        "--input-len", "32", "--output-len", "8",
                        "--device", "cpu", "--json", str(out),
                        "--plot", str(tmp_path / "online.png")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (tmp_path / "online.png").read_bytes().startswith(b"\x89PNG")
    assert not processes_with_environ(mark), "the server is still running"
    assert "速率 20/s" in printed and "TTFT" in printed
    report = json.loads(out.read_text(encoding="utf-8"))
    [run] = report["runs"]
    assert run["rate"] == 20 and run["cache_type"] == "radix"
    assert (run["completed"], run["failed"]) == (5, 0)
    assert run["exact_output_lengths"]
    for r in run["requests"]:
        assert r["ok"] and r["output_tokens"] == r["requested_tokens"]
        assert 4 <= r["requested_tokens"] <= 8 and 16 <= r["prompt_tokens"] <= 32
        assert 0 < r["ttft"] <= r["e2e"]
        assert r["sent"] >= r["arrival"] - 0.01
        # One gap per text chunk, and fewer chunks than tokens: a token whose text is not
        # complete yet (part of a UTF-8 character) arrives with the next one, and so do replies
        # that queue up while the API server is busy (ch15: they go out together), which on a
        # loaded machine can be the whole answer at once.
        assert 0 <= len(r["itl"]) <= r["output_tokens"] - 1
    assert run["output_tokens"] == sum(r["requested_tokens"] for r in run["requests"])
    for key in ("ttft_ms", "e2e_ms", "tpot_ms"):
        s = run[key]
        assert 0 < s["p50"] <= s["p90"] <= s["p99"]
    gaps = [gap for r in run["requests"] for gap in r["itl"]]
    s = run["itl_ms"]
    assert (s["p50"] is None) == (not gaps)
    assert not gaps or 0 < s["p50"] <= s["p90"] <= s["p99"]
    assert run["ttft_ms"]["p99"] <= run["e2e_ms"]["p99"]
    assert run["request_throughput"] == pytest.approx(5 / run["duration_s"])
    assert run["output_throughput"] > 0
    # Every process of the server by its role, and the client: CPU seconds over the run.
    assert set(run["cpu_s"]) == {online.CLIENT, "API Server（启动者）", "scheduler-rank0",
                                 "tokenizer"}
    assert all(seconds >= 0 for seconds in run["cpu_s"].values())
    assert run["cpu_s"]["scheduler-rank0"] > 0  # it ran the model
    assert "每个进程的 CPU" in printed


@pytest.fixture(scope="module")
def running_server() -> Iterator[str]:
    """A tiny-qwen3 server already running, for runs with --url (the script starts none); its
    URL."""
    server = online.Server([sys.executable, "-m", "minisgl", "--model", str(TINY), "--port", "0"])
    try:
        server.wait_ready(START_TIMEOUT)
        yield server.url
    finally:
        online.stop_server(server)


@pytest.mark.parametrize("client", ["httpx", "openai"])
def test_each_client_reads_chat_streams_to_the_exact_length(tmp_path, capsys, client,
                                                           running_server):
    """The chat path (shared-prefix), through our event-stream reader and through the openai
    package's client: both count the same tokens the server says it sent. Both measure one
    server that runs already (--url)."""
    out = tmp_path / "online.json"
    code = online.main(["--model", str(TINY), "--url", running_server, "--workload",
                        "shared-prefix", "--num-users", "2", "--turns", "2", "--system-len", "16",
                        "--turn-len", "4", "--output-len", "6", "--rates", "inf",
                        "--device", "cpu", "--client", client, "--json", str(out)])
    assert code == 0, capsys.readouterr().out
    [run] = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert (run["completed"], run["failed"]) == (4, 0)
    assert run["exact_output_lengths"] and run["output_tokens"] == 4 * 6
    # A request's text may come in one chunk (test_a_small_run_completes_every_request_...)
    assert all(r["ttft"] > 0 and len(r["itl"]) <= 5 for r in run["requests"])


def test_a_server_that_cannot_start_fails_the_run_with_its_message(capsys):
    code = online.main(["--model", str(TINY), "--num-requests", "1", "--rates", "1",
                        "--device", "cpu", "--server-args", "--tp 0"])
    assert code == 1
    assert "--tp must be >= 1" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# benchmark/client_cost.py: the clients alone, on a stream held in memory

client_cost = load_script("client_cost")


def test_the_stream_in_memory_is_what_our_server_sends():
    from minisgl.server.protocol import completion_body

    events = [json.loads(e.removeprefix(b"data: ")) for e in client_cost.stream_events(7, 2)[:-1]]
    expected = [completion_body(7, "m", False, text, reason, True)
                for text, reason in [(" the", None), (" of", None), ("", "length")]]
    for e in expected:
        e["created"] = 0
    assert events[:3] == expected
    assert events[3]["choices"] == [] and events[3]["usage"]["completion_tokens"] == 2
    assert client_cost.stream_events(7, 2)[-1] == b"data: [DONE]\n\n"


def test_client_cost_reads_every_chunk_with_both_clients(capsys):
    assert client_cost.main(["--streams", "3", "--chunks", "5", "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    assert "共 15 块" in printed
    for kind in ("httpx", "openai"):
        [row] = [line for line in printed.splitlines() if line.startswith(f"  --client {kind}")]
        microseconds = float(row.split()[4])
        assert microseconds > 0


# ----------------------------------------------------------------------------------------------
# benchmark/process_cpu.py: CPU time by process, from /proc

process_cpu = load_script("process_cpu")


def test_cpu_seconds_grow_with_work_and_children_come_in_start_order():
    import subprocess
    import sys
    import time

    before = process_cpu.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of CPU
        pass
    assert process_cpu.cpu_seconds(os.getpid()) - before >= 0.2
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "a = subprocess.Popen(['sleep', '30']); time.sleep(0.2)\n"
        "b = subprocess.Popen(['sleep', '30']); time.sleep(0.2)\n"
        "print(a.pid, b.pid, flush=True); time.sleep(30)")], stdout=subprocess.PIPE, text=True)
    try:
        first, second = map(int, parent.stdout.readline().split())
        assert process_cpu.children(parent.pid) == [first, second]
        roles = process_cpu.server_processes(parent.pid, ranks=1)
        assert roles == {"API Server（启动者）": parent.pid, "scheduler-rank0": first,
                         "tokenizer": second}
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)])
        parent.kill()
        parent.wait()
    assert process_cpu.cpu_seconds(parent.pid) is None  # gone
    assert process_cpu.snapshot({"gone": parent.pid}) == {}


def test_workers_forked_by_a_forkserver_stand_in_for_it():
    """The engine's workers are children of its forkserver (chapter 13), not of the launcher:
    the per-process table must find them, not the idle forkserver."""
    from minisgl.utils.process import Children
    from processes import children_of, cmdline

    children = Children()
    for i in range(2):
        children.start("process_targets:ready_then_sleep", f"worker-{i}")
    try:
        children.wait_ready(timeout=60)
        found = process_cpu.children(os.getpid())
        workers = [p.pid for p in children.processes]
        assert [p for p in found if p in workers] == workers  # both, in start order
        forkservers = [c for c in children_of(os.getpid())
                       if "multiprocessing.forkserver" in cmdline(c)]
        assert forkservers and not set(forkservers) & set(found)
    finally:
        children.stop()
