"""The API server's end of the pipeline: requests go into the tokenizers, and each reply that
comes back from the detokenizer is routed to the request waiting for it."""

from __future__ import annotations

import asyncio
import threading

from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, Message, StatsMsg, StatsReply, TokenizeMsg, UserReply,
                             decode, encode, unbatch)
from minisgl.utils import trace
from minisgl.utils.zmq_queue import PullQueue, PushQueue

from .protocol import APIError


class ServerFailed(APIError):
    """A process of the server has died: no request will be answered, now or later. 503: the
    client may try another server, or this one once it has been started again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503, kind="server_error")


class Frontend:
    """Lives in the event loop's thread, except for one listener thread that only receives.
    A request's messages all go to one tokenizer (uid modulo their number): its abort cannot
    overtake its prompt. One more than `max_queued` requests waiting for their first reply is
    refused here, before it costs another process anything (the KV pool bounds the running)."""

    def __init__(self, tokenizer_inboxes: list[str], frontend: str,
                 max_queued: int | None = None) -> None:
        self.to_tokenizers = [PushQueue(a, bind=False, encode=encode) for a in tokenizer_inboxes]
        self.replies = PullQueue(frontend, bind=True, decode=decode)
        self.waiting: dict[int, asyncio.Queue[UserReply | StatsReply | ServerFailed]] = {}
        self.max_queued = max_queued
        self.queued: set[int] = set()  # the uids of requests without a reply yet
        self.next_uid = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopped = threading.Event()
        self.listener: threading.Thread | None = None
        self.failure: str | None = None  # why nothing can be answered any more (see fail)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.listener = threading.Thread(target=self._listen, name="frontend-listener",
                                         daemon=True)
        self.listener.start()

    def _listen(self) -> None:
        while not self.stopped.is_set():
            message = self.replies.get(timeout_ms=100)  # wakes up to notice `stopped`
            if message is not None:
                assert self.loop is not None
                self.loop.call_soon_threadsafe(self._deliver, unbatch(message))

    def _deliver(self, replies: list[Message]) -> None:
        trace.messages("recv", replies, self.replies.address)
        for reply in replies:
            self.queued.discard(reply.uid)
            queue = self.waiting.get(reply.uid)
            if queue is not None:  # no one waits for an aborted request's last reply
                queue.put_nowait(reply)

    def _send(self, uid: int, message: Message) -> None:
        # Nothing goes out at shutdown (nowhere to go) or after a failure (the tokenizer may be
        # the process that died).
        if not self.stopped.is_set() and self.failure is None:
            queue = self.to_tokenizers[uid % len(self.to_tokenizers)]
            trace.messages("send", [message], queue.address)  # before: it cannot arrive first
            queue.put(message)

    def _new_uid(self) -> tuple[int, asyncio.Queue]:
        uid, self.next_uid = self.next_uid, self.next_uid + 1
        self.waiting[uid] = asyncio.Queue()
        return uid, self.waiting[uid]

    def submit(self, prompt: str | list[dict[str, str]], params: SamplingParams,
               fit_to_context: bool = False) -> tuple[int, asyncio.Queue]:
        """Send a request; its UserReplies arrive on the returned queue, the last one with
        finished=True, or a ServerFailed. The caller must call done(uid) once it stops reading.
        A full queue is a 503: the request may succeed later (OpenAI's clients retry it)."""
        if self.failure is not None:
            raise ServerFailed(self.failure)
        if self.max_queued is not None and len(self.queued) >= self.max_queued:
            raise APIError(f"{len(self.queued):,} requests are waiting for their first token, "
                           f"the most this server queues (--max-queued-req {self.max_queued:,}); "
                           "try again later", status=503, kind="server_error")
        uid, queue = self._new_uid()
        self.queued.add(uid)
        try:
            self._send(uid, TokenizeMsg(uid, prompt, params, fit_to_context))
        except BaseException:  # e.g. a value msgpack cannot encode: do not leak the uid
            self.abort(uid)  # the scheduler ignores an abort of a uid it never received
            raise
        return uid, queue

    def done(self, uid: int) -> None:
        self.waiting.pop(uid, None)
        self.queued.discard(uid)

    def abort(self, uid: int) -> None:
        """The client is gone (or a stop string ended it): free what the request holds."""
        self.queued.discard(uid)
        if self.waiting.pop(uid, None) is not None:
            self._send(uid, AbortMsg(uid))

    async def stats(self) -> dict[str, int]:
        uid, queue = self._new_uid()
        try:
            self._send(uid, StatsMsg(uid))
            reply = await queue.get()
        finally:
            self.done(uid)
        if isinstance(reply, ServerFailed):
            raise reply
        assert isinstance(reply, StatsReply)
        return reply.stats

    def fail(self, reason: str) -> int:
        """A process of the server has died: every waiting request gets a ServerFailed after
        the replies already queued for it, and every later one at once. How many waited."""
        self.failure = reason
        for queue in self.waiting.values():
            queue.put_nowait(ServerFailed(reason))
        return len(self.waiting)

    def close(self) -> None:
        self.stopped.set()
        if self.listener is not None:
            self.listener.join()
        for q in (*self.to_tokenizers, self.replies):
            q.close()
