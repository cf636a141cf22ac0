"""`python -m minisgl --model PATH --shell`: chat in the terminal, no HTTP in between."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable

from minisgl.core import SamplingParams
from minisgl.utils.process import ChildExit

from .api_server import Generation
from .frontend import Frontend, ServerFailed
from .protocol import APIError

HELP = "Type a message. /reset forgets the conversation, /exit (or Ctrl-D) quits."


def _read_stdin(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue) -> None:
    """A daemon thread's body, not an executor's (Ctrl-C would wait for the next Enter): each
    line of stdin on `lines`, then None. It reads the unbuffered file: a thread parked in
    sys.stdin holds its buffer's lock, and the interpreter aborts if it must close it at exit."""
    encoding = sys.stdin.encoding or "utf-8"
    try:
        for line in iter(sys.stdin.buffer.raw.readline, b""):
            loop.call_soon_threadsafe(lines.put_nowait, line.decode(encoding, "replace"))
        loop.call_soon_threadsafe(lines.put_nowait, None)
    except RuntimeError:  # the loop has closed: the shell has ended
        pass


async def _watch(frontend: Frontend, exited: Callable[[], ChildExit | None]) -> None:
    """Fail every request once a child process has died: no reply would ever come."""
    while (gone := exited()) is None:
        await asyncio.sleep(0.5)
    frontend.fail(str(gone))


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
    watch = asyncio.create_task(_watch(frontend, exited))  # held: the loop keeps tasks weakly
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_stdin, args=(loop, lines), name="stdin", daemon=True).start()
    history: list[dict[str, str]] = []
    print(HELP)
    while True:
        print("> ", end="", flush=True)
        if (line := await lines.get()) is None:  # the end of stdin (Ctrl-D)
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
        try:
            uid, replies = frontend.submit(history, SamplingParams(max_tokens=max_seq_len), True)
            gen, answer = Generation(frontend, uid, replies, stops=[]), ""
            await gen.wait_first()  # Ctrl-C aborts the request, as a client's departure does
            async for piece in gen.pieces():
                print(piece, end="", flush=True)
                answer += piece
        except ServerFailed as e:
            print(f"\n[error] {e.message}; the shell stops")
            return False
        except APIError as e:  # refused, e.g. a conversation longer than max_seq_len
            print(f"[error] {e.message}")
            history.pop()  # the turn did not happen
            continue
        history.append({"role": "assistant", "content": answer})
        print()


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
