"""The HTTP side: OpenAI-compatible endpoints over the Frontend."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from minisgl.message import UserReply
from minisgl.tokenizer import StopMatcher
from minisgl.utils import trace

from .frontend import Frontend, ServerFailed
from .protocol import (APIError, ChatCompletionRequest, CompletionRequest, SamplingFields,
                       completion_body)

CHECK_CLIENT_S = 0.5  # how often a non-streaming request checks that its client is still there


class Generation:
    """One request's replies, cut at its stop strings, with its usage counts."""

    def __init__(self, frontend: Frontend, uid: int, queue: asyncio.Queue,
                 stops: list[str]) -> None:
        self.frontend, self.uid, self.queue = frontend, uid, queue
        self.first: UserReply | None = None  # set by wait_first
        self.matcher = StopMatcher(stops)
        self.prompt_tokens = self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.checked = time.monotonic()  # when the client was last seen to be there

    @property
    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    async def _next(self, client_gone: Callable[[], Awaitable[bool]] | None
                    ) -> UserReply | None:
        """The next reply, or None once `client_gone` says so; raises ServerFailed if a process
        of the server has died. `client_gone` is asked every CHECK_CLIENT_S even while replies
        keep coming: a busy request must notice too (streaming: Starlette watches for us)."""
        timeout = None if client_gone is None else CHECK_CLIENT_S
        while True:
            if client_gone is not None and time.monotonic() - self.checked > CHECK_CLIENT_S:
                self.checked = time.monotonic()
                if await client_gone():
                    return None
            try:
                reply = await asyncio.wait_for(self.queue.get(), timeout)
            except asyncio.TimeoutError:
                continue
            if isinstance(reply, ServerFailed):
                raise reply
            return reply

    async def wait_first(self, client_gone: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Wait for the first reply (a request may queue for long), watching the client: a
        refusal becomes an APIError, and a departure or a cancellation frees the request."""
        try:
            first = await self._next(client_gone)
        except BaseException:  # cancelled, e.g. by the graceful shutdown's timeout
            self.frontend.abort(self.uid)
            raise
        if first is None:  # 499: nginx's "client closed request"; no one reads it
            self.frontend.abort(self.uid)
            raise APIError("the client disconnected before the first token", status=499)
        if first.error:
            self.frontend.done(self.uid)
            raise APIError(first.error)
        self.first = first

    def _with_queued(self, reply: UserReply) -> list[UserReply]:
        """`reply` and the replies queued behind it: a chunk costs the same whether it carries
        one token or ten, so a stream that fell behind catches up."""
        replies = [reply]
        # Once the server has failed, a ServerFailed waits in the queue: _next raises it.
        while (not replies[-1].finished and not self.queue.empty()
               and self.frontend.failure is None):
            replies.append(self.queue.get_nowait())
        return replies

    async def pieces(self, client_gone: Callable[[], Awaitable[bool]] | None = None
                     ) -> AsyncIterator[str]:
        """The text as it is produced; finish_reason is set once it ends. A request that ends
        early (the client is gone, a stop string) is aborted, which frees its KV pages."""
        reply: UserReply | None = self.first
        ended = False
        try:
            while reply is not None:
                text = ""
                for reply in self._with_queued(reply):
                    ended = reply.finished
                    self.prompt_tokens = reply.prompt_tokens
                    self.completion_tokens += 1
                    text += self.matcher.feed(reply.incremental_output)
                    if self.matcher.stopped:
                        self.finish_reason = "stop"
                        break
                    if reply.finished:
                        text += self.matcher.flush()
                        self.finish_reason = reply.finish_reason
                if text:
                    yield text
                if self.finish_reason is not None:
                    return
                reply = await self._next(client_gone)
        finally:
            if ended:
                self.frontend.done(self.uid)
            else:  # the client is gone, or a stop string came first: free the request
                self.frontend.abort(self.uid)


class GenerationStream(StreamingResponse):
    """A streamed answer that frees its request however the stream ends, even if the client
    left before the generator ran (abort() does nothing once the request has ended)."""

    def __init__(self, events: AsyncIterator[str], gen: Generation) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.gen = gen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.gen.frontend.abort(self.gen.uid)


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _events(gen: Generation, model_name: str, chat: bool,
                  include_usage: bool) -> AsyncIterator[str]:
    """A streamed answer as server-sent events: the role (chat only), one chunk per piece of
    text, the finish reason, the usage if asked for, and [DONE]. If a process of the server
    dies meanwhile, an error object and [DONE]: the status line has gone out already."""
    if chat:  # the first chunk of a chat stream names the role, and only that one
        first = completion_body(gen.uid, model_name, True, "", None, True)
        first["choices"][0]["delta"]["role"] = "assistant"
        yield _sse(first)
    try:
        async for piece in gen.pieces():
            trace.instant("sse_write", uid=gen.uid, text=piece)
            yield _sse(completion_body(gen.uid, model_name, chat, piece, None, True))
    except ServerFailed as e:
        yield _sse(e.body())
        yield "data: [DONE]\n\n"
        return
    trace.instant("http_done", uid=gen.uid, finish_reason=gen.finish_reason)
    yield _sse(completion_body(gen.uid, model_name, chat, "", gen.finish_reason, True))
    if include_usage:
        yield _sse({**completion_body(gen.uid, model_name, chat, "", None, True),
                    "choices": [], "usage": gen.usage})
    yield "data: [DONE]\n\n"


@asynccontextmanager
async def _lifespan(frontend: Frontend, on_ready: Callable[[], Awaitable[None]] | None,
                    _: FastAPI) -> AsyncIterator[None]:
    """Start the Frontend (and `on_ready`) once the event loop is up; close it at the end."""
    frontend.start(asyncio.get_running_loop())
    ready = asyncio.create_task(on_ready()) if on_ready else None
    try:
        yield
    finally:
        if ready is not None:
            ready.cancel()
        frontend.close()


async def _api_error(_: Request, e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _invalid_body(request: Request, e: RequestValidationError) -> JSONResponse:
    errors = e.errors()
    if any(err["type"] == "json_invalid" for err in errors):
        return await _api_error(request, APIError("the request body is not valid JSON"))
    where = [".".join(str(x) for x in err["loc"][1:]) for err in errors]
    problems = "; ".join(f"{w or 'body'}: {err['msg']}" for w, err in zip(where, errors))
    return await _api_error(request, APIError(f"invalid request: {problems}",
                                              param=where[0] or None))


async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return await _api_error(request, APIError(str(e.detail), status=e.status_code, kind=kind))


ERROR_HANDLERS = {APIError: _api_error, RequestValidationError: _invalid_body,
                  HTTPException: _http_error}


def create_app(frontend: Frontend, model_name: str, max_seq_len: int,
               on_ready: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """The app; `on_ready` runs once the event loop is up."""
    lifespan = partial(_lifespan, frontend, on_ready)
    app = FastAPI(title="mini-sglang", version="0.1", lifespan=lifespan,
                  exception_handlers=ERROR_HANDLERS)

    async def start(body: SamplingFields, prompt: Any, default_max_tokens: int | None,
                    request: Request) -> Generation:
        arrived = trace.now()
        params, fit = body.sampling_params(default_max_tokens)
        uid, queue = frontend.submit(prompt, params, fit)
        trace.span("http_request", arrived, uid=uid, path=request.url.path, stream=body.stream)
        gen = Generation(frontend, uid, queue, body.stop_strings())
        # Wait for it, streaming or not: a refused request becomes an HTTP error.
        await gen.wait_first(request.is_disconnected)
        return gen

    async def respond(body: SamplingFields, gen: Generation, chat: bool, request: Request):
        if not body.stream:
            text = "".join([piece async for piece in gen.pieces(request.is_disconnected)])
            return {**completion_body(gen.uid, model_name, chat, text, gen.finish_reason, False),
                    "usage": gen.usage}
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return GenerationStream(_events(gen, model_name, chat, include_usage), gen)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        # OpenAI's default for completions is 16 tokens.
        return await respond(body, await start(body, body.prompt, 16, request), False, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        messages = [m.model_dump() for m in body.messages]
        max_tokens = (body.max_tokens if body.max_completion_tokens is None
                      else body.max_completion_tokens)
        body = body.model_copy(update={"max_tokens": max_tokens})
        return await respond(body, await start(body, messages, None, request), True, request)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "minisgl", "max_model_len": max_seq_len}]}

    @app.get("/health")
    async def health() -> dict:
        if frontend.failure is not None:  # 503: a load balancer sends nothing more here
            raise ServerFailed(frontend.failure)
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict:
        """The scheduler's counters: KV pages free / cached / locked, requests running."""
        return await frontend.stats()

    return app
