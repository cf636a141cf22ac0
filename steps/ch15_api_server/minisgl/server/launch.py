"""`python -m minisgl`: start the processes, serve HTTP (or a shell), stop everything at the end.

Processes: this one (API server), one tokenizer process that also detokenizes (or
--num-tokenizer tokenizers and a detokenizer), and the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from minisgl.utils.process import Children
from minisgl.utils.zmq_queue import ipc_address, new_run_id

from .api_server import create_app
from .args import ServerArgs, parse_args
from .frontend import Frontend
from .shell import run_shell


@dataclass
class Backend:
    """The child processes and the addresses the API server talks to."""

    children: Children
    tokenizer_inboxes: list[str]
    frontend: str
    max_seq_len: int


def start_backend(args: ServerArgs) -> Backend:
    """Start every child and wait until all have loaded what they need. A child that fails
    stops the others and raises RuntimeError with its traceback."""
    run_id = new_run_id()
    address = lambda name: ipc_address(run_id, name)  # noqa: E731
    scheduler_inbox, frontend = address("scheduler"), address("frontend")
    inboxes = [address(f"tokenizer-{i}") for i in range(max(args.num_tokenizer, 1))]
    detokenizer = inboxes[0] if args.num_tokenizer == 0 else address("detokenizer")
    tokenizers = [(f"tokenizer-{i}", inbox) for i, inbox in enumerate(inboxes)]
    if args.num_tokenizer > 0:
        tokenizers.append(("detokenizer", detokenizer))
    children = Children(run_id)
    try:  # everything started so far is stopped if anything (a signal too) interrupts us
        children.start("minisgl.scheduler.io:run_scheduler", "scheduler", config=args.scheduler,
                       rank=0, world_size=1, inbox=scheduler_inbox, broadcast=address("broadcast"),
                       acks=address("acks"), reply=detokenizer)
        for name, inbox in tokenizers:
            children.start("minisgl.tokenizer.worker:run_tokenizer", name,
                           model_path=args.scheduler.model_path, inbox=inbox, bind_inbox=True,
                           scheduler=scheduler_inbox, frontend=frontend)
        infos = children.wait_ready()
    except BaseException:
        children.stop()
        raise
    return Backend(children, inboxes, frontend, infos["scheduler"]["max_seq_len"])


def http_url(host: str, port: int) -> str:
    """The server's URL: an IPv6 host goes in brackets (http://[::1]:1919)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn raises the signal again after its shutdown, which would kill this process
        # before it stops its children.
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.signal(s, self.handle_exit) for s in signals}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @property
    def port(self) -> int:
        """The port it listens on: the one asked for, or the free one --port 0 was given."""
        return self.servers[0].sockets[0].getsockname()[1]


def serve(args: ServerArgs, backend: Backend) -> None:
    """HTTP until SIGINT/SIGTERM; uvicorn handles both and shuts down gracefully."""
    frontend = Frontend(backend.tokenizer_inboxes, backend.frontend)
    server: _Server | None = None

    async def announce() -> None:
        while server is None or not server.started:
            await asyncio.sleep(0.05)
        print(f"minisgl: ready, serving {args.model_name} at {http_url(args.host, server.port)}/v1 "
              f"(max_seq_len {backend.max_seq_len})", flush=True)

    app = create_app(frontend, args.model_name, backend.max_seq_len, on_ready=announce)
    server = _Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=3))
    server.run()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(f"minisgl: loading {args.scheduler.model_path} ...", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C, until uvicorn's
    try:
        backend = start_backend(args)
    except RuntimeError as e:
        print(f"minisgl: could not start: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # start_backend has stopped what it started
        print("minisgl: interrupted while loading", file=sys.stderr)
        return 130
    try:
        if args.shell:
            run_shell(backend.tokenizer_inboxes, backend.frontend, backend.max_seq_len)
        else:
            serve(args, backend)
    except KeyboardInterrupt:
        pass  # a signal just before uvicorn took over: stop as usual
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):  # stopping the children must not be cut short
            signal.signal(s, signal.SIG_IGN)
        backend.children.stop()
        print("minisgl: stopped", flush=True)
    return 0
