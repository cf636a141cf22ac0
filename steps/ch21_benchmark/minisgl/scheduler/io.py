"""The scheduler process: messages in, scheduler steps, tokens out. Rank 0 alone receives, and
re-broadcasts the raw bytes to the other ranks one frame per loop iteration, so every rank takes
the same decisions at the same iteration; rank 0 alone sends results."""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass, replace

import msgpack

from minisgl.core import fit_max_tokens
from minisgl.message import (AbortMsg, DetokenizeMsg, ExitMsg, Message, StatsMsg, StatsReply,
                             UserMsg, batched, decode, encode, unbatch)
from minisgl.utils import trace
from minisgl.utils.process import Children, Reporter
from minisgl.utils.zmq_queue import PubQueue, PullQueue, PushQueue, SubQueue

from .config import SchedulerConfig
from .fault import corrupt_page_table, fault_step_from_env
from .scheduler import Scheduler, TokenOutput
from .traced import create_scheduler

MAX_DRAIN = 256  # messages taken into one iteration at most
PROBE, GO = b"probe", b"go"  # start-up handshake frames; real frames are msgpack lists


class SchedulerIO:
    """Receiving and sending for one rank. PUB drops what it sends before a subscriber has
    connected: rank 0 sends probes until every other rank has acknowledged one, then GO."""

    def __init__(self, rank: int, world_size: int, inbox: str, broadcast: str, acks: str,
                 reply: str | None) -> None:
        self.rank, self.world_size = rank, world_size
        self.reply = PushQueue(reply, bind=False, encode=encode) if reply else None
        if rank == 0:
            self.inbox = PullQueue(inbox, bind=True, decode=decode)
            if world_size > 1:
                self.broadcast = PubQueue(broadcast, bind=True, encode=encode)
                self.acks = PullQueue(acks, bind=True, decode=decode)
        else:
            self.subscription = SubQueue(broadcast, bind=False, decode=decode)
            self.acks = PushQueue(acks, bind=False, encode=encode)

    def close(self) -> None:
        """Close this rank's queues; the ones it bound remove their socket files."""
        for name in ("reply", "inbox", "broadcast", "acks", "subscription"):
            if (queue := getattr(self, name, None)) is not None:
                queue.close()

    def handshake(self) -> None:
        """Returns once every rank is sure to receive every later frame."""
        if self.world_size == 1:
            return
        if self.rank == 0:
            acked: set[int] = set()
            while len(acked) < self.world_size - 1:
                self.broadcast.put_raw(PROBE)
                if (ack := self.acks.get(timeout_ms=50)) is not None:
                    acked.add(ack.uid)
            self.broadcast.put_raw(GO)
            return
        acked = False
        while (frame := self.subscription.get_raw()) != GO:
            if frame == PROBE and not acked:
                self.acks.put(AbortMsg(uid=self.rank))  # any message will do: it carries our rank
                acked = True

    def receive(self, blocking: bool) -> list[Message]:
        """This iteration's messages; with `blocking`, wait until there is at least one."""
        if self.rank == 0:
            raws = []
            if blocking:
                raws.append(self.inbox.get_raw())
            while len(raws) < MAX_DRAIN and (raw := self.inbox.get_raw(timeout_ms=0)) is not None:
                raws.append(raw)
            if self.world_size > 1:  # one frame per iteration, even an empty one: lockstep
                self.broadcast.put_raw(msgpack.packb(raws))
        else:  # an idle rank 0 blocks too, so waiting here is always right
            raws = msgpack.unpackb(self.subscription.get_raw())
        messages = [m for raw in raws for m in unbatch(decode(raw))]
        # Rank 0 alone ties them to their senders: the other ranks get copies nobody sent them.
        trace.messages("recv", messages, self.inbox.address if self.rank == 0 else None)
        return messages

    def send(self, messages: list[Message]) -> None:
        if self.reply is not None and messages:  # rank 0: the only one whose results go anywhere
            trace.messages("send", messages, self.reply.address)  # before: it cannot arrive first
            self.reply.put(batched(messages))


class StepFailed(Exception):
    """A scheduler step raised; the message names the step, the cause is the error."""


class SchedulerLoop:
    """Turns messages into Scheduler calls and the Scheduler's tokens into messages.

    `fault_step`: corrupt the page table before that step (scheduler/fault.py), or the first
    one after it that has a running request."""

    def __init__(self, scheduler: Scheduler, io: SchedulerIO,
                 fault_step: int | None = None) -> None:
        self.scheduler, self.io = scheduler, io
        self.steps = 0  # scheduler steps so far
        self.fault_step = fault_step
        self.prompt_tokens: dict[int, int] = {}  # of the running requests, for their usage
        # Where the loop's time goes, in seconds: idle (blocked for messages: nothing to do),
        # receiving (taking and decoding messages while there is work), stepping, sending.
        self.seconds = dict.fromkeys(("idle", "receive", "step", "send"), 0.0)

    def handle(self, msg: Message) -> list[Message]:
        if isinstance(msg, UserMsg):
            try:
                params = msg.sampling_params
                if msg.fit_to_context:  # as many tokens as fit, by the request-length rule
                    params = replace(params, max_tokens=fit_max_tokens(
                        len(msg.input_ids), None, self.scheduler.engine.max_seq_len))
                self.scheduler.add_request(msg.uid, msg.input_ids, params)
            except ValueError as e:  # too long for the context or the KV pool: refuse it
                return [DetokenizeMsg(msg.uid, -1, finished=True, error=str(e))]
            self.prompt_tokens[msg.uid] = len(msg.input_ids)
        elif isinstance(msg, AbortMsg):
            # Tell the detokenizer too, so it drops the request's text state.
            if self.scheduler.abort(msg.uid):
                del self.prompt_tokens[msg.uid]
                return [DetokenizeMsg(msg.uid, -1, finished=True, error="aborted")]
        return []

    def report(self, token: TokenOutput) -> DetokenizeMsg:
        if not token.finished:
            return DetokenizeMsg(token.uid, token.token, False,
                                 prompt_tokens=self.prompt_tokens[token.uid])
        return DetokenizeMsg(token.uid, token.token, True,
                             finish_reason="stop" if token.eos else "length",
                             prompt_tokens=self.prompt_tokens.pop(token.uid))

    def run_once(self) -> bool:
        """One iteration: take the messages, run a step if there is work, send the results.
        False once an ExitMsg has arrived."""
        out: list[Message] = []
        stats_requests = []
        start = time.perf_counter()
        idle = not self.scheduler.has_work
        messages = self.io.receive(blocking=idle)
        for msg in messages:
            if isinstance(msg, ExitMsg):
                return False
            if isinstance(msg, StatsMsg):
                stats_requests.append(msg)
            else:
                out += self.handle(msg)
        received = time.perf_counter()
        self.seconds["idle" if idle else "receive"] += received - start
        if self.scheduler.has_work:
            out += [self.report(t) for t in self._step()]
        stepped = time.perf_counter()
        self.seconds["step"] += stepped - received
        # Answered after the step: a request aborted in the batch in flight is freed in it.
        out += [StatsReply(m.uid, self.stats()) for m in stats_requests]
        self.io.send(out)
        self.seconds["send"] += time.perf_counter() - stepped
        return True

    def _step(self) -> list[TokenOutput]:
        """One scheduler step; an error in it (a device fault, a bug) becomes StepFailed, whose
        message says which step and what was running."""
        self.steps += 1
        if self.fault_step is not None and self.steps >= self.fault_step:
            if corrupt_page_table(self.scheduler):
                self.fault_step = None
        try:
            return self.scheduler.step()
        except Exception as e:
            running = len(self.scheduler.decode.running)
            waiting = len(self.scheduler.prefill.pending)
            # A CUDA error goes on for lines of advice; its first line says what happened.
            error = (str(e).strip().splitlines() or [""])[0]
            raise StepFailed(f"step {self.steps} failed ({running} requests running, {waiting} "
                             f"waiting): {type(e).__name__}: {error}") from e

    def stats(self) -> dict[str, int]:
        return {**self.scheduler.stats(),
                **{f"loop_{name}_us": int(s * 1e6) for name, s in self.seconds.items()}}


def run_scheduler(*, config: SchedulerConfig, inbox: str, broadcast: str, acks: str,
                  reply: str | None, status: Reporter) -> None:
    """A scheduler process, TP rank config.tp_rank: load this rank's shards, report ready with
    the limits the API server must know, then loop until an ExitMsg. A step that fails raises
    StepFailed, which the launcher prints in the line that says this process ended."""
    scheduler = create_scheduler(config)
    io = SchedulerIO(config.tp_rank, config.tp_size, inbox, broadcast, acks, reply)
    with closing(io):
        io.handshake()
        status.ready({"max_seq_len": scheduler.engine.max_seq_len})
        loop = SchedulerLoop(scheduler, io, fault_step_from_env())
        while loop.run_once():
            pass
    # Not after an error: the process ends at once then (utils/process.py), and after a device
    # fault every CUDA call fails, engine.close() too, over the error that names the step.
    scheduler.engine.close()  # its process group too


@dataclass(frozen=True)
class SchedulerAddresses:
    inbox: str  # where rank 0 receives requests
    reply: str  # where rank 0 sends its results
    broadcast: str  # rank 0 -> the other ranks
    acks: str  # the other ranks -> rank 0, once, at start-up
    rendezvous: str  # where the TP ranks build their process group (rendezvous_address)


def start_schedulers(children: Children, config: SchedulerConfig,
                     addresses: SchedulerAddresses) -> None:
    """One scheduler process per TP rank, named scheduler-rank0, -rank1, ...; only rank 0
    replies. Each is in `children` once started: the caller's stop() covers an interruption."""
    init = addresses.rendezvous if config.tp_size > 1 else None
    for rank in range(config.tp_size):
        children.start("minisgl.scheduler.io:run_scheduler", f"scheduler-rank{rank}",
                       config=replace(config, tp_rank=rank, dist_init_address=init),
                       inbox=addresses.inbox, broadcast=addresses.broadcast, acks=addresses.acks,
                       reply=addresses.reply if rank == 0 else None)
