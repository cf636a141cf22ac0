"""Chapter 14: the scheduler process. Scheduler.abort wherever a request is (waiting, mid-way
through a chunked prefill, decoding; overlap on and off), the loop's replies (errors, aborts,
stats after the step), rank 0's rebroadcast in lockstep, real scheduler processes with two
ranks, and PUB/SUB queues that never drop a frame."""

from __future__ import annotations

import inspect
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest
import torch
import zmq

from conftest import MODELS_DIR, TINY_QWEN3
from minisgl.core import Req, SamplingParams, set_global_ctx
from minisgl.message import (AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, StatsMsg, StatsReply,
                             UserMsg, decode, encode, unbatch)
from minisgl.scheduler import Scheduler, SchedulerConfig, TokenOutput
from minisgl.scheduler.io import SchedulerIO, SchedulerLoop, run_scheduler
from minisgl.utils.process import Children
from minisgl.utils.zmq_queue import PubQueue, PullQueue, PushQueue, SubQueue, ipc_address, new_run_id
from scheduler_helpers import held_requests

CHAPTER = 14  # tools/steps.py check runs this module on chapter 14's own tree

VOCAB = 49152  # tiny-qwen3


def config(overlap: bool, **overrides) -> SchedulerConfig:
    options = dict(max_running_req=3, page_size=4, num_page_override=64,
                   max_seq_len_override=128, cache_type="radix", overlap=overlap)
    options.update(overrides)
    return SchedulerConfig(str(MODELS_DIR / TINY_QWEN3), dtype=torch.float32, **options)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def random_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]  # no BOS/EOS ids


def step_checked(s: Scheduler, outputs: dict[int, list[TokenOutput]]) -> None:
    for out in s.step():
        outputs.setdefault(out.uid, []).append(out)
    s.cache.check_integrity(held_requests(s))


def assert_everything_back(s: Scheduler, max_running_req: int) -> None:
    stats = s.stats()
    assert stats["free_pages"] + stats["cached_pages"] == stats["num_pages"], stats
    assert stats["locked_pages"] == 0, stats
    assert stats["rows_free"] == max_running_req, stats
    assert stats["running"] == stats["waiting"] == 0, stats
    assert s.in_flight is None and not s.finished and s.cache.handles == {}
    s.cache.check_integrity([])


# --------------------------------------------------------------------------- TokenOutput.eos


@pytest.mark.parametrize("overlap", [True, False])
def test_token_output_says_whether_eos_ended_the_request(overlap):
    """eos is True exactly on the last token of a request that met an EOS token; reaching
    max_tokens, or meeting EOS with ignore_eos, gives eos=False."""
    s = Scheduler(config(overlap))
    try:
        s.add_request(0, random_ids(0, 6), greedy(8))
        outputs: dict[int, list[TokenOutput]] = {}
        while s.has_work:
            step_checked(s, outputs)
        reference = [o.token for o in outputs[0]]
        s.eos_token_ids = frozenset({reference[3]})  # the model "emits EOS" at its 4th token
        s.add_request(1, random_ids(0, 6), SamplingParams(max_tokens=8))
        s.add_request(2, random_ids(0, 6), greedy(8))
        while s.has_work:
            step_checked(s, outputs)
    finally:
        s.engine.close()
    assert [o.eos for o in outputs[0]] == [False] * 8
    assert [(o.finished, o.eos) for o in outputs[1]] == [(False, False)] * 3 + [(True, True)]
    assert [o.token for o in outputs[2]] == reference  # ignore_eos: it runs on
    assert not any(o.eos for o in outputs[2]) and outputs[2][-1].finished


# --------------------------------------------------------------------------- Scheduler.abort

# Three requests, and where the victim stands when it is aborted. The victim is uid 2.
REQUESTS = {0: (random_ids(0, 6), 12), 1: (random_ids(1, 9), 12), 2: (random_ids(2, 40), 12)}


@dataclass
class AbortCase:
    overrides: dict
    where: Callable[[Scheduler], bool]  # abort after the first step at which this holds


def _pending(s: Scheduler, uid: int):
    return next((p for p in s.prefill.pending if p.uid == uid), None)


def _in_flight(s: Scheduler, req: Req | None) -> bool:
    return req is not None and s.in_flight is not None and req in s.in_flight.batch.reqs


def _waiting(s: Scheduler) -> bool:  # no row for it: two rows, both taken by uids 0 and 1
    p = _pending(s, 2)
    return p is not None and p.chunk is None and s.decode.runnable


def _chunked(s: Scheduler) -> bool:  # at least two chunks computed, the rest still waiting
    p = _pending(s, 2)
    return (p is not None and p.chunk is not None and p.chunk.device_len >= 16
            and (not s.overlap or _in_flight(s, p.chunk)))


def _decoding(s: Scheduler) -> bool:  # it has produced a few tokens (and, with overlap, is in
    req = next((r for r in s.decode.running if r.uid == 2), None)  # the batch in flight)
    return (req is not None and len(req.input_ids) >= 40 + 3
            and (not s.overlap or _in_flight(s, req)))


CASES = {
    "waiting": AbortCase(dict(max_running_req=2), _waiting),
    "chunked": AbortCase(dict(max_prefill_length=8), _chunked),
    "decoding": AbortCase({}, _decoding),
}


def run_requests(s: Scheduler, abort_where: Callable[[Scheduler], bool] | None):
    """All REQUESTS arrive at once; with abort_where, uid 2 is aborted after the first step at
    which it holds. Returns the outputs by uid, and how many uid 2 had at the abort."""
    set_global_ctx(s.engine.ctx)  # the engine created last owns the Context: take it back
    for uid, (ids, max_tokens) in REQUESTS.items():
        s.add_request(uid, ids, greedy(max_tokens))
    outputs: dict[int, list[TokenOutput]] = {uid: [] for uid in REQUESTS}
    at_abort = None
    steps = 0
    while s.has_work:
        step_checked(s, outputs)
        if abort_where is not None and at_abort is None and abort_where(s):
            at_abort = len(outputs[2])
            assert s.abort(2) is True
            s.cache.check_integrity(held_requests(s))
        steps += 1
        assert steps < 500, "the scheduler does not make progress"
    return outputs, at_abort


_BASELINES: dict[tuple, dict[int, list[TokenOutput]]] = {}


def baseline(case: str, overlap: bool) -> dict[int, list[TokenOutput]]:
    key = (case, overlap)
    if key not in _BASELINES:
        s = Scheduler(config(overlap, **CASES[case].overrides))
        _BASELINES[key] = run_requests(s, None)[0]
    return _BASELINES[key]


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("case", list(CASES))
def test_abort_frees_everything_and_leaves_the_others_unchanged(case, overlap):
    c = CASES[case]
    s = Scheduler(config(overlap, **c.overrides))
    outputs, at_abort = run_requests(s, c.where)
    assert at_abort is not None, f"uid 2 never reached the {case} state"
    assert len(outputs[2]) == at_abort  # nothing more was reported for it
    assert not any(o.finished for o in outputs[2])
    expected = baseline(case, overlap)
    for uid in (0, 1):
        assert outputs[uid] == expected[uid]
        assert len(outputs[uid]) == REQUESTS[uid][1] and outputs[uid][-1].finished
    assert_everything_back(s, c.overrides.get("max_running_req", 3))


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_abort_in_the_batch_in_flight_is_freed_when_that_batch_is_read(overlap):
    s = Scheduler(config(overlap))
    set_global_ctx(s.engine.ctx)
    s.add_request(5, random_ids(5, 10), greedy(20))
    outputs: dict[int, list[TokenOutput]] = {}
    for _ in range(3):
        step_checked(s, outputs)
    req = next(iter(s.decode.running))
    assert s.abort(5)
    # Serial: nothing is in flight, so the row is back at once. Overlap: the device may still
    # be computing the request, so it waits in `finished` until that batch has been read.
    assert (req in s.finished) == overlap
    assert s.stats()["rows_free"] == 3 - overlap
    while s.has_work:
        step_checked(s, outputs)
    assert_everything_back(s, 3)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_abort_of_an_unknown_or_finished_request_returns_false(overlap):
    s = Scheduler(config(overlap))
    outputs, _ = run_requests(s, None)
    assert all(outputs[uid][-1].finished for uid in REQUESTS)
    assert s.abort(0) is False  # finished
    assert s.abort(99) is False  # never seen
    assert_everything_back(s, 3)


def test_abort_twice_returns_false_the_second_time():
    s = Scheduler(config(overlap=False))
    set_global_ctx(s.engine.ctx)
    s.add_request(7, random_ids(7, 5), greedy(4))
    assert s.abort(7) is True
    assert s.abort(7) is False
    assert not s.has_work


# --------------------------------------------------------------------------- SchedulerLoop


class ScriptedIO:
    """Stands in for SchedulerIO: each receive() returns the next scripted list (then nothing);
    send() records what the loop sends."""

    def __init__(self, script: list[list]) -> None:
        self.script, self.sent, self.blocking = list(script), [], []

    def receive(self, blocking: bool) -> list:
        self.blocking.append(blocking)
        return self.script.pop(0) if self.script else []

    def send(self, messages: list) -> None:
        if messages:
            self.sent.append(list(messages))


def make_loop(overlap: bool = True, script: list[list] | None = None, **overrides):
    s = Scheduler(config(overlap, **overrides))
    set_global_ctx(s.engine.ctx)
    io = ScriptedIO(script or [])
    return SchedulerLoop(s, io), s, io


def user(uid: int, n: int, max_tokens: int) -> UserMsg:
    return UserMsg(uid, torch.tensor(random_ids(uid, n), dtype=torch.int32), greedy(max_tokens))


def test_handle_refuses_a_too_long_prompt_with_an_error_reply_and_keeps_serving():
    loop, s, _ = make_loop(max_seq_len_override=64)
    [reply] = loop.handle(user(3, 60, 8))
    assert isinstance(reply, DetokenizeMsg)
    assert (reply.uid, reply.next_token, reply.finished) == (3, -1, True)
    assert "60" in reply.error and "64" in reply.error, reply.error
    assert not s.has_work
    assert loop.handle(user(4, 10, 2)) == []
    while s.has_work:
        loop.run_once()
    tokens = [m for sent in loop.io.sent for m in sent if isinstance(m, DetokenizeMsg)]
    assert [(m.uid, m.finished, m.error) for m in tokens] == [(4, False, ""), (4, True, "")]


def test_handle_abort_of_a_running_request_replies_aborted():
    loop, s, _ = make_loop()
    loop.handle(user(1, 10, 20))
    for _ in range(3):
        loop.run_once()
    [reply] = loop.handle(AbortMsg(1))
    assert isinstance(reply, DetokenizeMsg)
    assert (reply.uid, reply.next_token, reply.finished, reply.error) == (1, -1, True, "aborted")
    assert loop.handle(AbortMsg(1)) == []  # gone now: nothing to tell anyone
    assert loop.handle(AbortMsg(42)) == []


def test_run_once_answers_stats_after_the_step_so_an_abort_in_flight_is_already_freed():
    loop, s, io = make_loop(overlap=True)
    loop.handle(user(1, 10, 20))
    for _ in range(3):
        loop.run_once()
    assert _in_flight(s, next(iter(s.decode.running)))
    io.script.append([AbortMsg(1), StatsMsg(9)])
    before_step = []
    real_step = s.step

    def step():
        before_step.append(s.stats())
        return real_step()

    s.step = step
    assert loop.run_once()
    # Before the step the aborted request still held its pages (the device could be using
    # them); the reply, made after the step, already sees them back.
    held = before_step[0]
    assert held["free_pages"] + held["cached_pages"] < held["num_pages"] or held["locked_pages"]
    [stats] = [m for m in io.sent[-1] if isinstance(m, StatsReply)]
    assert stats.uid == 9
    assert stats.stats["free_pages"] + stats.stats["cached_pages"] == stats.stats["num_pages"]
    assert stats.stats["locked_pages"] == 0 and stats.stats["running"] == 0
    assert io.sent[-1][-1] is stats  # after the step's tokens
    assert any(isinstance(m, DetokenizeMsg) and m.error == "aborted" for m in io.sent[-1])


def test_run_once_blocks_only_when_idle_and_stops_at_exit_msg():
    loop, s, io = make_loop(script=[[user(1, 5, 3)]])
    assert loop.run_once() and io.blocking == [True]  # idle: wait for a message
    while s.has_work:
        assert loop.run_once()
    io.script.append([ExitMsg()])
    assert loop.run_once() is False
    assert io.blocking == [True] + [False] * (len(io.blocking) - 2) + [True]


# --------------------------------------------------------------------------- SchedulerIO lockstep


def two_ranks() -> tuple[SchedulerIO, SchedulerIO, PushQueue]:
    run_id = new_run_id()
    addresses = {n: ipc_address(run_id, n) for n in ("inbox", "broadcast", "acks")}
    rank0 = SchedulerIO(0, 2, reply=None, **addresses)
    rank1 = SchedulerIO(1, 2, reply=None, **addresses)
    follower = threading.Thread(target=rank1.handshake, daemon=True)
    follower.start()
    rank0.handshake()
    follower.join(timeout=30)
    assert not follower.is_alive()
    return rank0, rank1, PushQueue(addresses["inbox"], bind=False, encode=encode)


def wire(messages: list) -> list[bytes]:
    return [encode(m) for m in messages]


def test_rank_1_gets_rank_0s_messages_frame_for_frame_even_empty_ones():
    rank0, rank1, tokenizer = two_ranks()
    try:
        sent = [user(1, 4, 2), AbortMsg(1), StatsMsg(2)]
        tokenizer.put(BatchMsg(sent))
        tokenizer.put(AbortMsg(3))
        time.sleep(0.2)  # most likely one iteration takes both sends; not required below
        got = []
        while len(got) < 4:
            frame0 = rank0.receive(blocking=True)
            assert rank1.subscription._socket.poll(5_000)
            assert wire(rank1.receive(blocking=False)) == wire(frame0)
            got += frame0
        assert wire(got) == wire(sent + [AbortMsg(3)])  # unbatched, in order
        # An iteration with nothing still sends a frame: rank 1 must not fall a frame behind.
        assert rank0.receive(blocking=False) == []
        assert rank1.subscription._socket.poll(5_000)
        assert rank1.receive(blocking=True) == []
        assert not rank1.subscription._socket.poll(100)  # exactly one frame per iteration
    finally:
        tokenizer.close()
        rank0.close()
        rank1.close()


# --------------------------------------------------------------------------- real processes

PROCESS_CONFIG = dict(max_running_req=4, page_size=4, num_page_override=128,
                      max_seq_len_override=64)
PROMPTS = {uid: random_ids(100 + uid, 5 + 3 * uid) for uid in range(4)}
MAX_TOKENS = 8


class Collector:
    """What one rank sent back: tokens per uid, last messages, stats replies."""

    def __init__(self, address: str) -> None:
        self.queue = PullQueue(address, bind=True, decode=decode)
        self.tokens: dict[int, list[int]] = {}
        self.ended: dict[int, DetokenizeMsg] = {}
        self.stats: list[StatsReply] = []
        self.after_end: list[DetokenizeMsg] = []  # anything for a uid that had already ended

    def pump(self, until: Callable[[], bool], timeout_ms: int = 60_000) -> None:
        while not until():
            raw = self.queue.get(timeout_ms=timeout_ms)
            if raw is None:
                raise TimeoutError("no reply from the scheduler")
            for msg in unbatch(raw):
                if isinstance(msg, StatsReply):
                    self.stats.append(msg)
                    continue
                if msg.uid in self.ended:
                    self.after_end.append(msg)
                if msg.next_token >= 0:
                    self.tokens.setdefault(msg.uid, []).append(msg.next_token)
                if msg.finished:
                    self.ended[msg.uid] = msg


@dataclass
class ProcessRun:
    infos: dict
    ranks: list[Collector]
    tokens_before_abort: int = 0
    exit_codes: list = field(default_factory=list)
    socket_files_left: list = field(default_factory=list)  # the ranks' own, after they exit


def rank_args(rank: int, run_id: str, world_size: int = 2) -> dict:
    """run_scheduler's arguments that place a rank. Chapter 14 passes the place as arguments
    (every rank a full replica); chapter 16 moves it into the config, where the ranks also form
    a process group and each loads its shard. This module runs on both trees."""
    cfg = config(overlap=True, **PROCESS_CONFIG)
    if "rank" in inspect.signature(run_scheduler).parameters:
        return dict(config=cfg, rank=rank, world_size=world_size)
    # The ranks meet in a file of this run, as chapter 16's launcher has them do.
    rendezvous = "file://" + ipc_address(run_id, "rendezvous").removeprefix("ipc://")
    return dict(config=replace(cfg, tp_rank=rank, tp_size=world_size,
                               dist_init_address=rendezvous))


@pytest.fixture(scope="module")
def process_run() -> Iterator[ProcessRun]:
    """Two scheduler processes (TP size 2, tiny-qwen3), each sending its results to a
    collector of its own, driven through the whole scenario once: four requests, an abort
    followed at once by a stats request, a too-long prompt and the next request, ExitMsg."""
    run_id = new_run_id()
    inbox, broadcast, acks = (ipc_address(run_id, n) for n in ("inbox", "broadcast", "acks"))
    outs = [ipc_address(run_id, f"out{rank}") for rank in range(2)]
    ranks = [Collector(out) for out in outs]
    # Rank 1 gets a reply address too, so its results can be compared with rank 0's.
    children = Children()
    for rank, out in enumerate(outs):
        children.start("minisgl.scheduler.io:run_scheduler", f"scheduler-rank{rank}", inbox=inbox,
                       broadcast=broadcast, acks=acks, reply=out, **rank_args(rank, run_id))
    tokenizer = PushQueue(inbox, bind=False, encode=encode)
    try:
        run = ProcessRun(children.wait_ready(timeout=120), ranks)
        for uid, ids in PROMPTS.items():
            tokenizer.put(UserMsg(uid, torch.tensor(ids, dtype=torch.int32), greedy(MAX_TOKENS)))
        for r in ranks:
            r.pump(lambda r=r: all(uid in r.ended for uid in PROMPTS))

        tokenizer.put(UserMsg(10, torch.tensor(random_ids(10, 8), dtype=torch.int32), greedy(50)))
        for r in ranks:
            r.pump(lambda r=r: len(r.tokens.get(10, [])) >= 3)
        tokenizer.put(AbortMsg(10))
        tokenizer.put(StatsMsg(11))
        for r in ranks:
            r.pump(lambda r=r: 10 in r.ended and r.stats)

        tokenizer.put(UserMsg(20, torch.zeros(70, dtype=torch.int32), greedy(4)))
        tokenizer.put(UserMsg(21, torch.tensor(PROMPTS[0], dtype=torch.int32), greedy(MAX_TOKENS)))
        for r in ranks:
            r.pump(lambda r=r: 20 in r.ended and 21 in r.ended)

        tokenizer.put(ExitMsg())
        for p in children.processes:
            p.join(timeout=60)
        run.exit_codes = [p.exitcode for p in children.processes]
        run.socket_files_left = [a for a in (inbox, broadcast, acks)
                                 if os.path.exists(a.removeprefix("ipc://"))]
        yield run
    finally:
        children.stop()
        tokenizer.close()
        for r in ranks:
            r.queue.close()


def in_process_tokens() -> dict[int, list[int]]:
    s = Scheduler(config(overlap=False, **PROCESS_CONFIG))
    set_global_ctx(s.engine.ctx)
    for uid, ids in PROMPTS.items():
        s.add_request(uid, ids, greedy(MAX_TOKENS))
    tokens: dict[int, list[int]] = {uid: [] for uid in PROMPTS}
    while s.has_work:
        for out in s.step():
            tokens[out.uid].append(out.token)
    return tokens


def test_both_ranks_report_ready_with_max_seq_len(process_run):
    assert process_run.infos == {f"scheduler-rank{r}": {"max_seq_len": 64} for r in range(2)}


def test_both_ranks_produce_the_same_tokens_as_the_scheduler_in_process(process_run):
    rank0, rank1 = process_run.ranks
    expected = in_process_tokens()
    assert {uid: rank0.tokens[uid] for uid in PROMPTS} == expected
    assert rank1.tokens == rank0.tokens
    assert {u: (m.next_token, m.error) for u, m in rank1.ended.items()} == \
        {u: (m.next_token, m.error) for u, m in rank0.ended.items()}


def test_stats_right_after_an_abort_show_every_page_back_on_both_ranks(process_run):
    rank0, rank1 = process_run.ranks
    assert rank0.ended[10].error == "aborted" and rank0.ended[10].next_token == -1
    assert 3 <= len(rank0.tokens[10]) < 50
    assert rank0.after_end == rank1.after_end == []  # "aborted" is the request's last word
    [reply0], [reply1] = rank0.stats, rank1.stats
    # Same decisions on both ranks: every count equal; only the time counters (_us) differ.
    decisions = [{k: v for k, v in r.stats.items() if not k.endswith("_us")}
                 for r in (reply0, reply1)]
    assert reply0.uid == reply1.uid == 11 and decisions[0] == decisions[1]
    stats = reply0.stats
    assert stats["free_pages"] + stats["cached_pages"] == stats["num_pages"] == 128, stats
    assert stats["locked_pages"] == 0 and stats["running"] == stats["waiting"] == 0, stats
    assert stats["rows_free"] == 4, stats


def test_a_too_long_prompt_gets_an_error_and_the_next_request_is_served(process_run):
    rank0, rank1 = process_run.ranks
    refused = rank0.ended[20]
    assert refused.next_token == -1 and "70" in refused.error and "64" in refused.error
    assert 20 not in rank0.tokens
    assert rank0.tokens[21] == rank0.tokens[0]  # same prompt, greedy: same tokens
    assert rank1.ended[20].error == refused.error


def test_exit_msg_ends_both_ranks_with_code_0(process_run):
    assert process_run.exit_codes == [0, 0]


def test_ranks_remove_the_socket_files_they_bound_when_they_exit(process_run):
    assert process_run.socket_files_left == []


# --------------------------------------------------------------------------- PUB/SUB backlog

LAG = 5000
PAYLOAD = 1024  # bytes a frame: 5000 of them are more than the kernel's socket buffer holds


def subscribed(pub_put: Callable[[bytes], None], sub_get: Callable[[int], bytes | None]) -> None:
    """Probe until the subscription is in effect, then drain the probes."""
    deadline = time.monotonic() + 30
    while sub_get(20) is None:
        pub_put(b"probe")
        assert time.monotonic() < deadline, "the subscription never took effect"
    while sub_get(100) is not None:
        pass


def frames() -> list[bytes]:
    return [i.to_bytes(4, "little") * (PAYLOAD // 4) for i in range(LAG)]


def test_pub_and_sub_queues_have_no_high_water_mark():
    address = ipc_address(new_run_id(), "hwm")
    pub = PubQueue(address, bind=True, encode=encode)
    sub = SubQueue(address, bind=False, decode=decode)
    try:
        for q in (pub, sub):
            assert q._socket.getsockopt(zmq.SNDHWM) == 0
            assert q._socket.getsockopt(zmq.RCVHWM) == 0
    finally:
        pub.close()
        sub.close()


def test_a_sub_lagging_5000_frames_behind_still_receives_every_one_in_order():
    address = ipc_address(new_run_id(), "lag")
    pub = PubQueue(address, bind=True, encode=encode)
    sub = SubQueue(address, bind=False, decode=decode)
    try:
        subscribed(pub.put_raw, lambda t: sub.get_raw(timeout_ms=t))
        sent = frames()
        for frame in sent:  # the subscriber reads nothing meanwhile
            pub.put_raw(frame)
        got = []
        while (raw := sub.get_raw(timeout_ms=2_000)) is not None:
            got.append(raw)
        assert len(got) == LAG and got == sent
    finally:
        pub.close()
        sub.close()


def test_zmq_default_high_water_mark_drops_frames_silently():
    """Why the limit is lifted: with ZMQ's defaults (1000 frames each side) the same lag loses
    frames, and the publisher is not told."""
    context = zmq.Context.instance()
    address = ipc_address(new_run_id(), "default-hwm")
    pub, sub = context.socket(zmq.PUB), context.socket(zmq.SUB)
    try:
        for s in (pub, sub):
            s.setsockopt(zmq.LINGER, 0)
        assert pub.getsockopt(zmq.SNDHWM) == 1000
        pub.bind(address)
        sub.connect(address)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        subscribed(pub.send, lambda t: sub.recv() if sub.poll(t) else None)
        for frame in frames():
            pub.send(frame)  # never raises, never blocks
        got = 0
        while sub.poll(2_000):
            sub.recv()
            got += 1
        assert 0 < got < LAG
    finally:
        pub.close()
        sub.close()
        os.unlink(address.removeprefix("ipc://"))  # a raw ZMQ socket leaves its file behind


# --- the chapter's example ---

import ast  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

from conftest import SMOLLM2  # noqa: E402
from processes import run_example  # noqa: E402


def test_example_streams_greedy_tokens_aborts_and_gets_every_page_back(hf_model, hf_tokenizer,
                                                                        hf_greedy):
    out = run_example("ch14_scheduler_io.py", timeout=600)
    tokenizer, hf = hf_tokenizer(SMOLLM2), hf_model(SMOLLM2)
    eos = json.loads((MODELS_DIR / SMOLLM2 / "generation_config.json").read_text())["eos_token_id"]
    rows = re.findall(r"^  uid=(\d+) token= *(-?\d+) .* finished=(True|False) ?(.*)$", out, re.M)
    got = {uid: [(int(t), f == "True", e) for u, t, f, e in rows if u == uid] for uid in "01"}
    # Request 0: greedy, max_tokens=8, stops at EOS if transformers' greedy reaches one first.
    want = hf_greedy(hf, tokenizer("The capital of France is").input_ids, 8)
    want = want[: want.index(eos) + 1] if eos in want else want
    assert [t for t, _, _ in got["0"]] == want
    assert [f for _, f, _ in got["0"]] == [False] * (len(want) - 1) + [True]
    # Request 1 (ignore_eos, up to 200) is aborted: the tokens it got before that are
    # transformers' greedy ones, then one last message without a token says so.
    *tokens, last = got["1"]
    assert last == (-1, True, "aborted") and len(tokens) < 200
    ids = [t for t, finished, _ in tokens if not finished]
    assert len(ids) == len(tokens)
    assert ids == hf_greedy(hf, tokenizer("Tell me a long story.").input_ids, len(ids))
    stats = ast.literal_eval(re.search(r"^统计（请求 99）：(\{.*\})$", out, re.M).group(1))
    assert stats["num_pages"] == 512  # num_page_override
    assert stats["free_pages"] + stats["cached_pages"] == 512
    assert stats["running"] == stats["waiting"] == 0
    assert "ExitMsg 之后调度器进程的退出码： 0" in out
