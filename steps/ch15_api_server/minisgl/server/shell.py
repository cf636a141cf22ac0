"""`python -m minisgl --model PATH --shell`: chat in the terminal, no HTTP in between."""

from __future__ import annotations

import asyncio

from minisgl.core import SamplingParams

from .frontend import Frontend

HELP = "Type a message. /reset forgets the conversation, /exit (or Ctrl-D) quits."


async def _chat(frontend: Frontend, max_seq_len: int) -> None:
    loop = asyncio.get_running_loop()
    frontend.start(loop)
    history: list[dict[str, str]] = []
    print(HELP)
    while True:
        try:
            line = await loop.run_in_executor(None, input, "> ")
        except EOFError:
            print()
            return
        line = line.strip()
        if line in ("/exit", "/quit"):
            return
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
                reply = await replies.get()
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


def run_shell(tokenizer_inboxes: list[str], frontend_address: str, max_seq_len: int) -> None:
    """Until /exit, Ctrl-D or Ctrl-C."""
    frontend = Frontend(tokenizer_inboxes, frontend_address)
    try:
        asyncio.run(_chat(frontend, max_seq_len))
    except KeyboardInterrupt:
        print()
    finally:
        frontend.close()
