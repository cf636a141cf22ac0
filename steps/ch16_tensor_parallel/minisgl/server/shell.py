"""`python -m minisgl --model PATH --shell`: chat in the terminal, no HTTP in between."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable

from minisgl.core import SamplingParams
from minisgl.message import UserReply
from minisgl.utils.process import ChildExit

from .frontend import Frontend

HELP = "Type a message. /reset forgets the conversation, /exit (or Ctrl-D) quits."


def _read_stdin(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue) -> None:
    """A daemon thread's body: put each line of stdin on `lines`, then None at its end.
    Not an executor thread: asyncio.run and the interpreter's exit join those, so Ctrl-C at
    the prompt would wait for the next Enter. It reads stdin's unbuffered file, a byte at a
    time: a thread parked inside sys.stdin holds its buffer's lock, and the interpreter aborts
    if it has to close that buffer at exit."""
    encoding = sys.stdin.encoding or "utf-8"
    try:
        for line in iter(sys.stdin.buffer.raw.readline, b""):
            loop.call_soon_threadsafe(lines.put_nowait, line.decode(encoding, "replace"))
        loop.call_soon_threadsafe(lines.put_nowait, None)
    except RuntimeError:  # the loop has closed: the shell has ended
        pass


async def _input(lines: asyncio.Queue) -> str:
    """The next line typed at the prompt, like input(); EOFError at the end of stdin."""
    print("> ", end="", flush=True)
    line = await lines.get()
    if line is None:
        raise EOFError
    return line


async def _next_reply(replies: asyncio.Queue,
                      exited: Callable[[], ChildExit | None]) -> UserReply | None:
    """The next reply; None if a child process has died meanwhile (no reply would ever come)."""
    while True:
        try:
            return await asyncio.wait_for(replies.get(), 0.5)
        except asyncio.TimeoutError:
            if (gone := exited()) is not None:
                print(f"\n[error] {gone}; the shell stops")
                return None


async def _chat(frontend: Frontend, max_seq_len: int,
                exited: Callable[[], ChildExit | None]) -> bool:
    """False if it ended because a child process died."""
    loop = asyncio.get_running_loop()
    # Ctrl-C cancels this task. asyncio.run's own SIGINT handler is Python code that runs
    # when the main thread next executes bytecode; a signal the kernel hands to another
    # thread (stdin's reader, the frontend's listener) would leave the idle loop asleep in
    # epoll_wait, no timer due. add_signal_handler's wakeup fd wakes it from any thread.
    loop.add_signal_handler(signal.SIGINT, asyncio.current_task().cancel)
    frontend.start(loop)
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_stdin, args=(loop, lines), name="stdin", daemon=True).start()
    history: list[dict[str, str]] = []
    print(HELP)
    while True:
        try:
            line = await _input(lines)
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
                reply = await _next_reply(replies, exited)
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
              exited: Callable[[], ChildExit | None]) -> bool:
    """Until /exit, Ctrl-D or Ctrl-C (True), or until `exited()` names a child that has exited
    (False)."""
    frontend = Frontend(tokenizer_inboxes, frontend_address)
    try:
        return asyncio.run(_chat(frontend, max_seq_len, exited))
    # Ctrl-C: KeyboardInterrupt before _chat's handler is in place, CancelledError after.
    except (KeyboardInterrupt, asyncio.CancelledError):
        print()
        return True
    finally:
        frontend.close()
