"""在线基准的客户端自己每收一块要花多少 CPU：不起服务器，把事件流放在内存里喂给客户端。

online.py 的两个客户端（--client httpx：直接读事件流；--client openai：openai 包的 AsyncOpenAI）
各读同一份流：--streams 个请求同时进行，每个请求 --chunks 块文本，块的格式与我们的服务器发出的
相同（/v1/completions 的流式块，每块一个词，最后是 finish_reason 块、usage 块和 [DONE]）。
httpx 的 MockTransport 代替网络，所以测到的只有客户端这一侧：解析事件、构造对象、asyncio 的调度。
真实的网络读取还要再加上 socket 的开销，所以这是客户端每块代价的下界。

每个客户端跑 --rounds 轮（轮流），取最快的一轮；报告每块的 CPU 微秒数（进程 CPU 时间 / 块数）
和一个核每秒能收多少块（它的倒数）。在线测量时，如果服务器每秒发出的块数接近这个数，客户端
就可能是上限。

    python benchmark/client_cost.py
    python benchmark/client_cost.py --streams 200 --chunks 200 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import time
from collections.abc import AsyncIterator
from types import ModuleType

import httpx

from online import CLIENTS
from report import aligned, machine_line

WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as"]


def stream_events(uid: int, chunks: int) -> list[bytes]:
    """One request's stream as our server writes it: a chunk a token, then the end."""
    def event(body: dict) -> bytes:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    def chunk(text: str, finish_reason: str | None) -> dict:
        return {"id": f"cmpl-{uid}", "object": "text_completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": finish_reason}]}

    events = [event(chunk(" " + WORDS[i % len(WORDS)], None)) for i in range(chunks)]
    events.append(event(chunk("", "length")))
    usage = {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks}
    events.append(event({**chunk("", None), "choices": [], "usage": usage}))
    return events + [b"data: [DONE]\n\n"]


def http_module(kind: str) -> ModuleType:
    """The httpx a client is built on: openai 3.x builds on its own fork of it, httpx2, whose
    transports are classes of their own."""
    if kind == "httpx":
        return httpx
    import openai

    base = openai.DefaultAsyncHttpxClient.__mro__[1]  # the AsyncClient it subclasses
    return importlib.import_module(base.__module__.split(".")[0])


def versions(kind: str) -> str:
    """The packages a client's cost depends on, for the record."""
    http = http_module(kind)
    if kind == "httpx":
        return f"httpx {http.__version__}"
    import openai

    return f"openai {openai.__version__}（基于 {http.__name__} {http.__version__}）"


def transport(chunks: int, http: ModuleType):
    """Answers every request with a stream of `chunks` text chunks, one event per read."""
    counter = iter(range(1 << 30))

    async def body(events: list[bytes]) -> AsyncIterator[bytes]:
        for e in events:
            yield e

    def handle(request):
        events = stream_events(next(counter), chunks)
        return http.Response(200, headers={"content-type": "text/event-stream"},
                             content=body(events))

    return http.MockTransport(handle)


async def read_all(kind: str, streams: int, chunks: int) -> tuple[int, float, float]:
    """(text chunks received, process CPU seconds, wall seconds) for one round."""
    client = CLIENTS[kind]("http://client-cost", transport=transport(chunks, http_module(kind)))
    body = {"model": "m", "prompt": "hi", "max_tokens": chunks, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}

    async def one() -> int:
        received = 0
        async for text, usage in client.chunks(body, chat=False):
            received += bool(text)
            if usage:
                assert usage["completion_tokens"] == chunks
        return received

    cpu, wall = time.process_time(), time.perf_counter()
    try:
        received = sum(await asyncio.gather(*(one() for _ in range(streams))))
    finally:
        await client.close()
    return received, time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64, help="requests at once (default 64)")
    parser.add_argument("--chunks", type=int, default=200, help="text chunks a request (200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each keeps its best (3)")
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    args = parser.parse_args(argv)
    if min(args.streams, args.chunks, args.rounds) < 1:
        parser.error("--streams, --chunks and --rounds must be at least 1")

    print(machine_line())
    print("；".join(f"--client {kind}：{versions(kind)}" for kind in args.clients))
    total = args.streams * args.chunks
    print(f"{args.streams} 个请求同时进行，每个 {args.chunks} 块，共 {total:,} 块；"
          f"每个客户端 {args.rounds} 轮取最快")
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for kind in args.clients:  # alternating, so that both see the same machine
            received, cpu, wall = asyncio.run(read_all(kind, args.streams, args.chunks))
            if received != total:
                raise SystemExit(f"{kind}：收到 {received} 块，应为 {total}")
            if kind not in best or cpu < best[kind][0]:
                best[kind] = (cpu, wall)
    header = ["客户端", "CPU 秒", "墙钟秒", "微秒/块", "块/秒（一个核）"]
    rows = [[f"--client {kind}", f"{cpu:.2f}", f"{wall:.2f}", f"{cpu / total * 1e6:.1f}",
             f"{total / cpu:,.0f}"] for kind, (cpu, wall) in best.items()]
    print(aligned([header, *rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
