"""`python -m minisgl --model PATH --shell`: chat in the terminal, no HTTP in between."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from minisgl.core import SamplingParams
from minisgl.message import UserReply

from .frontend import Frontend

HELP = "Type a message. /reset forgets the conversation, /exit (or Ctrl-D) quits."


async def _next_reply(replies: asyncio.Queue, dead: Callable[[], list[str]]) -> UserReply | None:
    """The next reply; None if a child process has died meanwhile (no reply would ever come)."""
    while True:
        try:
            return await asyncio.wait_for(replies.get(), 0.5)
        except asyncio.TimeoutError:
            if gone := dead():
                print(f"\n[error] {', '.join(gone)} exited; the shell stops")
                return None


async def _chat(frontend: Frontend, max_seq_len: int, dead: Callable[[], list[str]]) -> bool:
    """False if it ended because a child process died."""
    loop = asyncio.get_running_loop()
    frontend.start(loop)
    history: list[dict[str, str]] = []
    print(HELP)
    while True:
        try:
            line = await loop.run_in_executor(None, input, "> ")
        except EOFError:
            print()
            return True
        line = line.strip()
        if line in ("/exit", "/quit"):
            return True
        if line == "/reset":
            history.clear()
            print("(conversation cleared)")
            continue
        if not line:
            continue
        history.append({"role": "user", "content": line})
        uid, replies = frontend.submit(history, SamplingParams(max_tokens=max_seq_len), True)
        answer, finished = [], False
        try:
            while not finished:
                reply = await _next_reply(replies, dead)
                if reply is None:
                    return False
                if reply.error:
                    print(f"[error] {reply.error}")
                    history.pop()  # the turn did not happen
                    break
                print(reply.incremental_output, end="", flush=True)
                answer.append(reply.incremental_output)
                finished = reply.finished
        finally:
            if finished:
                frontend.done(uid)
                history.append({"role": "assistant", "content": "".join(answer)})
                print()
            else:
                frontend.abort(uid)


def run_shell(tokenizer_inboxes: list[str], frontend_address: str, max_seq_len: int,
              dead: Callable[[], list[str]]) -> bool:
    """Until /exit, Ctrl-D or Ctrl-C (True), or until `dead()` names a child that has exited
    (False)."""
    frontend = Frontend(tokenizer_inboxes, frontend_address)
    try:
        return asyncio.run(_chat(frontend, max_seq_len, dead))
    except KeyboardInterrupt:
        print()
        return True
    finally:
        frontend.close()
