"""在线服务基准：启动 `python -m minisgl`，按泊松到达回放请求，测每个请求速率下的吞吐与延迟。

脚本自己把服务器作为子进程启动（--model、--port、--device、--cache-type 等传给它，其余选项用
--server-args），等它打印 "minisgl: ready"，先发两个预热请求，再对 --rates 里的每个速率回放同一份
负载：请求的到达间隔服从指数分布（泊松过程，固定种子；inf 表示所有请求同时发出）。客户端用
httpx 直接说 OpenAI 的协议（流式请求，server-sent events 一行一个 JSON），每收到一个 token 块记一次
时间——默认不用 openai 包：它为每一块构造 pydantic 对象，每秒几千块时客户端进程可能先于服务器
到顶，测到的就是客户端（第 21 章；benchmark/client_cost.py 单独量两个客户端每块的 CPU）。
于是每个请求都有：
  TTFT  首 token 时间：从发出请求到收到第一块非空文本；
  ITL   块间隔：相邻两块文本之间的时间（所有请求的所有间隔放在一起算分位数）。服务器每段新文字
        发一块，但一个请求排队的几段会并成一块（读的一方落后时），半个 UTF-8 字符的 token 也
        并进下一块，所以一块可能不止一个 token；按 token 算的间隔另有 TPOT：每个请求
        (E2E − TTFT) / (token 数 − 1)，写进 --json，并在下限一节打印；
  E2E   端到端延迟：从发出请求到流结束。
每个速率报告请求吞吐（完成的请求数 / 用时）、输出 token/s，以及三种延迟的 p50 / p90 / p99，打成
一张表；另一张表是每个进程在这段时间里用的 CPU（客户端自己，以及服务器的启动者即 API Server、
各 rank 的调度器、tokenizer，从 /proc 读，精度 10 毫秒）：占一个核的比例和每个输出 token 的微秒数——
单线程的 Python 进程占满一个核，它就是上限（GPU 上调度器等同步时，CUDA 默认可能自旋等待，
它的占用会偏高）。--json PATH 另存 JSON（含每个请求的记录），--plot PATH 把同样的结果画成 PNG：
TTFT、ITL、E2E 的 p50（实线）与 p99（虚线）随请求速率的变化，--compare-cache 时 radix、naive 各
一条。终端上每个速率显示一个进度条（按完成的请求）。结束时（包括 Ctrl-C 和出错）停掉服务器及其全部子进程。

两种负载：
- random（默认）：随机文本走 /v1/completions。提示词由"一个词正好是一个 token"的英文词拼成，
  提示词长度在 [input-len × range-ratio, input-len]、输出长度在 [output-len × range-ratio,
  output-len] 里均匀抽取（固定种子）；请求带 ignore_eos，输出长度是准确的。
- shared-prefix：多轮对话走 /v1/chat/completions。--num-users 位用户共用一段系统提示词，每人
  --turns 轮；每个请求 = 系统提示词 + 这位用户之前的各轮（历史里的回答是固定的随机文本，
  radix 与 naive 两次运行看到完全相同的提示词）+ 新的一问。请求按轮次排队：先是各用户的第 1 轮，
  再是第 2 轮……；一位用户的下一轮既要等到它的到达时间，也要等上一轮的回答结束，像真人聊天那样，
  所以这里的速率只是上限：用户少、回答慢时，实际请求速率由"答完一轮才问下一轮"决定。
  --compare-cache 在同一次运行里先后启动两次服务器（--cache-type radix 与 naive），并排报告，
  看 radix cache 复用共享前缀省下多少首 token 时间。

所有速率的请求长度相同；但每个速率换一批文本内容（种子派生），免得后一个速率命中前一个速率留在
radix cache 里的前缀。到达时间对每个速率用同一个种子，于是各速率的到达模式只差一个比例因子。

CPU 上的默认值很小（SmolLM2-135M，float32，2 核机器上几分钟跑完）：random 16 个请求，提示词
64–128、输出 16–32 个 token，速率 1 4 inf；shared-prefix 4 位用户 × 3 轮，系统提示词 256 个词。
--device cuda 时默认值按 GPU 放大：random 400 个请求，提示词 512–1024、输出 128–256，速率 8 16 32
inf；shared-prefix 64 位用户 × 4 轮，系统提示词 2048 个词、每轮提问 128 个词、回答 256 个 token。
每一项都可以在命令行上改。

CPU 上服务器的 PyTorch 线程数默认由引擎决定（每个物理核一个）；--server-threads N 改成 N 个。
机器空闲时这样最快：在 2 核虚拟机上，速率 inf，2 个线程 83.4、90.8、81.7 输出 token/s，1 个线程
50.9、45.8。但机器上另有任务在跑时，PyTorch 每个并行区域都要等齐所有线程，只要一个线程被挤下核，
其余的就干等：同一台机器跑着别的测试时，2 个线程只有 7.8、10.5 输出 token/s，1 个线程 34.5、49.6。
所以在共享的机器上，先用 --server-threads 试一下比核数少的线程数，再相信测出来的数字。

    python benchmark/online.py                                   # CPU，random 负载
    python benchmark/online.py --rates 1 inf --num-requests 8
    python benchmark/online.py --workload shared-prefix --compare-cache
    python benchmark/online.py --device cuda --model models/qwen3-0.6b-random --json online.json \\
        --plot online.png
    python benchmark/online.py --url http://127.0.0.1:30000 --model PATH   # 测一个已经在跑的服务器

注意：客户端和服务器跑在同一台机器上，在 2 核的 CPU 机器上它们互相抢核，绝对数字只说明趋势；
GPU 上吞吐极高时，单个 Python 客户端逐块解析 SSE 本身也可能成为瓶颈（看客户端进程的 CPU 占用）。
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import multiprocessing as mp
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyspy
from process_cpu import busiest_threads, server_processes, snapshot, thread_seconds
from report import aligned, machine_line, run_to_exit_code, save

if TYPE_CHECKING:
    import httpx

ROOT = Path(__file__).resolve().parent.parent

CPU_DEFAULTS = dict(client_processes=1, num_requests=16, input_len=128, output_len=32,
                    rates=[1.0, 4.0, math.inf],
                    num_users=4, turns=3, system_len=256, turn_len=32)
GPU_DEFAULTS = dict(client_processes=4, num_requests=400, input_len=1024, output_len=256,
                    rates=[8.0, 16.0, 32.0, math.inf],
                    num_users=64, turns=4, system_len=2048, turn_len=128)
PERCENTILES = (50, 90, 99)
# The serving floors (chapter 15): streamed throughput against LLM.generate on the same requests,
# ITL p50 against the engine's decode step, and on a GPU TTFT p50 at 16 req/s.
MIN_ONLINE_SHARE = 0.8
MAX_ITL_STEPS = 2.0
MAX_TTFT_MS = 150.0




# ----------------------------------------------------------------------------------------------
# Workloads (pure: no server, no network)


@dataclass
class Request:
    prompt: str | list[dict[str, str]]  # text for /v1/completions, messages for chat
    output_len: int
    after: int | None = None  # the request (previous turn) that must finish before this is sent


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each of n requests arrives: a Poisson process, i.e.
    exponential gaps with mean 1/rate; the first arrives at 0. inf: all at once. The same seed
    gives the same pattern at every rate, only scaled by 1/rate."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def single_token_words(tokenizer) -> list[str]:
    """Lower-case words (with their leading space) that the tokenizer encodes as exactly one
    token, so that a prompt of n of them is n tokens: random text of a known length."""
    pattern = re.compile(r"^ [a-z]{2,12}$")
    candidates = [(i, text) for i in range(len(tokenizer))
                  if pattern.match(text := tokenizer.decode([i]))]
    encoded = tokenizer([text for _, text in candidates], add_special_tokens=False).input_ids
    words = [text for (i, text), ids in zip(candidates, encoded) if ids == [i]]
    if len(words) < 100:
        raise ValueError("this tokenizer has too few single-token words for random prompts")
    return words


def random_text(rng: random.Random, words: list[str], n: int) -> str:
    # The leading space stays: without it the first word would be another token (or two).
    return "".join(rng.choice(words) for _ in range(n))


def draw_lengths(rng: random.Random, n: int, length: int, range_ratio: float) -> list[int]:
    low = max(1, math.ceil(length * range_ratio))
    return [rng.randint(low, length) for _ in range(n)]


def random_workload(words: list[str], num_requests: int, input_len: int, output_len: int,
                    range_ratio: float, seed: int, round_: int = 0) -> list[Request]:
    """Plain-text prompts. The lengths depend on `seed` only; the text on `round_` too, so
    every rate measures the same lengths without hitting prefixes cached by the rate before."""
    lengths = random.Random(seed)
    input_lens = draw_lengths(lengths, num_requests, input_len, range_ratio)
    output_lens = draw_lengths(lengths, num_requests, output_len, range_ratio)
    text = random.Random(f"{seed}:{round_}")
    return [Request(random_text(text, words, n), m) for n, m in zip(input_lens, output_lens)]


def shared_prefix_workload(words: list[str], num_users: int, turns: int, system_len: int,
                           turn_len: int, output_len: int, seed: int, round_: int = 0
                           ) -> list[Request]:
    """Multi-turn chats sharing one system prompt, turn-major (every user's turn 1, then every
    user's turn 2, ...). Request turn*num_users + user = system prompt + that user's earlier
    turns (the answers in the history are fixed random text, so that every server sees the
    same prompts whatever it generated) + a new question; it waits for the user's previous
    turn. Answers are exactly output_len tokens (ignore_eos)."""
    rng = random.Random(f"{seed}:{round_}")
    system = {"role": "system", "content": random_text(rng, words, system_len)}
    histories: list[list[dict[str, str]]] = [[system] for _ in range(num_users)]
    requests = []
    for turn in range(turns):
        for user in range(num_users):
            history = histories[user]
            history.append({"role": "user", "content": random_text(rng, words, turn_len)})
            after = None if turn == 0 else len(requests) - num_users
            requests.append(Request([dict(m) for m in history], output_len, after))
            history.append({"role": "assistant", "content": random_text(rng, words, output_len)})
    return requests


def prompt_ids(tokenizer, request: Request) -> list[int]:
    """The prompt's token ids as the server computes them (minisgl's tokenizer process does
    the same: the chat template, then no second BOS)."""
    if isinstance(request.prompt, str):
        return tokenizer(request.prompt).input_ids
    text = tokenizer.apply_chat_template(request.prompt, add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reusable_tokens(ids: list[list[int]], requests: list[Request]) -> list[int]:
    """Per request, the prompt tokens an earlier request has computed already: its previous
    turn's prompt, or for a first turn the first request's (the system prompt). An upper
    bound of what a prefix cache can save, if nothing is evicted and that request ran first."""
    shared = []
    for i, request in enumerate(requests):
        other = request.after if request.after is not None else (0 if i > 0 else None)
        shared.append(0 if other is None else common_prefix(ids[i], ids[other]))
    return shared


# ----------------------------------------------------------------------------------------------
# Statistics (pure)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile with linear interpolation between order statistics (numpy's
    default), so a p99 of few samples lies between the two largest rather than at one."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def stats(values: list[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 (None for no values: e.g. ITL when every answer is one token)."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    return {"mean": sum(values) / len(values),
            **{f"p{p}": percentile(values, p) for p in PERCENTILES}}


@dataclass
class Result:
    """One request as the client saw it; times in seconds."""

    index: int
    ok: bool = False
    error: str = ""
    requested_tokens: int = 0
    prompt_tokens: int = 0  # the server's count (usage)
    output_tokens: int = 0  # the server's count (usage)
    arrival: float = 0.0  # its Poisson arrival time, from the run's start
    sent: float = 0.0  # when it was sent (later than `arrival` if it waited for its previous turn)
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between text chunks


def summarize(results: list[Result], duration: float) -> dict:
    """A run's figures: throughput over `duration` (first arrival to last answer), latencies
    in milliseconds over the requests that completed."""
    ok = [r for r in results if r.ok]
    ms = lambda xs: [x * 1000 for x in xs]  # noqa: E731
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": output_tokens / duration if duration > 0 else 0.0,
        "prompt_tokens": sum(r.prompt_tokens for r in ok), "output_tokens": output_tokens,
        "exact_output_lengths": all(r.output_tokens == r.requested_tokens for r in ok),
        "chunks": sum(len(r.itl) + 1 for r in ok),  # text chunks received
        "ttft_ms": stats(ms(r.ttft for r in ok)),
        "itl_ms": stats(ms(gap for r in ok for gap in r.itl)),
        "e2e_ms": stats(ms(r.e2e for r in ok)),
        # Time per output token after the first, averaged per request: ITL without the gaps'
        # own spread, the figure other serving benchmarks call TPOT.
        "tpot_ms": stats(ms((r.e2e - r.ttft) / (r.output_tokens - 1)
                            for r in ok if r.output_tokens > 1)),
    }


# ----------------------------------------------------------------------------------------------
# The server


class Server:
    """`python -m minisgl` as a child in a session (process group) of its own: Ctrl-C in the
    terminal reaches only us, and we stop it in order (SIGTERM lets it stop its own children
    and unlink its sockets); if it does not exit in time, SIGKILL the whole group, so nothing
    is left running whatever happens."""

    def __init__(self, argv: list[str], threads: int | None = None,
                 engine: Path = ROOT / "python", env: dict[str, str] | None = None,
                 keep_lines: int | None = 200) -> None:
        """`env`: variables to add to the server's environment; `keep_lines`: how many of its
        last output lines `lines` keeps (None: all)."""
        self.argv, self.url = argv, ""  # the URL its ready line names (--port 0: any free port)
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.ready = threading.Event()
        env = {**os.environ, **(env or {})}
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        # Serve the engine of the repository this script belongs to (or --engine-path), not
        # whatever `minisgl` the interpreter would import (an editable install may point at
        # another checkout).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(engine),
                                                        env.get("PYTHONPATH", "")) if p)
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, bufsize=1,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:  # read all of it, so the pipe never fills up
            self.lines.append(line.rstrip("\n"))
            if "minisgl: ready" in line and (url := re.search(r" at (http://\S+)/v1 ", line)):
                self.url = url.group(1)
                self.ready.set()

    def tail(self, n: int = 30) -> str:
        return "\n".join(list(self.lines)[-n:])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.2):
            if not self.alive():
                raise RuntimeError(f"服务器启动失败（退出码 {self.popen.returncode}）：\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"服务器 {timeout:.0f} 秒内没有就绪：\n{self.tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever of the group is left (the launcher, if it did not stop in time; its
        # children, if it could not stop them), until none is, so that nothing outlives us.
        # Bounded: a child already dead stays in the group until init reaps it.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                break
            self.popen.wait()  # reap the launcher: a zombie would keep its group alive
            time.sleep(0.05)
        self.popen.wait()
        self.reader.join(5)


# ----------------------------------------------------------------------------------------------
# The client


Chunk = tuple[str | None, dict | None]  # a chunk of a stream: its text, and usage when it has it


class HttpxClient:
    """The OpenAI wire protocol read directly: server-sent events, one JSON object a line. The
    openai package's client (OpenAIClient) builds pydantic objects for every chunk; at a few
    thousand chunks a second a one-process client may reach its core's limit before the server
    does, and then it is the client that is measured (chapter 21)."""

    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport | None = None) -> None:
        import httpx

        # `transport` replaces the network (client_cost.py feeds a stream from memory).
        # No cap on connections (httpx's default of 100 would queue requests in the client,
        # where the server cannot see them), no timeout (a long queue at rate inf is what we
        # measure), and no retries (a retried request would hide a failure and its latency).
        self.http = httpx.AsyncClient(base_url=f"{base_url}/v1", timeout=None,
                                      transport=transport,
                                      limits=httpx.Limits(max_connections=None,
                                                          max_keepalive_connections=None))

    async def chunks(self, body: dict, chat: bool) -> AsyncIterator[Chunk]:
        """(text, usage) of each chunk of the stream, as it arrives."""
        path = "/chat/completions" if chat else "/completions"
        async with self.http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {response.status_code}: {detail[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                first = (chunk.get("choices") or [{}])[0]  # one choice: we never ask for n > 1
                text = first.get("delta", {}).get("content") if chat else first.get("text")
                yield text, chunk.get("usage")

    async def close(self) -> None:
        await self.http.aclose()


class OpenAIClient:
    """The same requests through the openai package's AsyncOpenAI (--client openai)."""

    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport | None = None) -> None:
        import httpx
        import openai

        http = openai.DefaultAsyncHttpxClient(
            transport=transport,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
        self.openai = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none",
                                         max_retries=0, timeout=httpx.Timeout(None),
                                         http_client=http)

    async def chunks(self, body: dict, chat: bool) -> AsyncIterator[Chunk]:
        fields = {k: v for k, v in body.items() if k != "ignore_eos"}
        create = self.openai.chat.completions.create if chat else self.openai.completions.create
        async for chunk in await create(**fields, extra_body={"ignore_eos": True}):
            text = next((c.delta.content if chat else c.text for c in chunk.choices), None)
            usage = chunk.usage and {"prompt_tokens": chunk.usage.prompt_tokens,
                                     "completion_tokens": chunk.usage.completion_tokens}
            yield text, usage

    async def close(self) -> None:
        await self.openai.close()


CLIENTS = {"httpx": HttpxClient, "openai": OpenAIClient}


async def send(client: HttpxClient | OpenAIClient, model: str, request: Request, result: Result,
               start: float) -> None:
    """One streaming request; fills `result`. Times are taken when each chunk arrives."""
    chat = not isinstance(request.prompt, str)
    body = {"model": model, "max_tokens": request.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "messages" if chat else "prompt": request.prompt}
    sent = time.perf_counter()
    result.sent, result.requested_tokens = sent - start, request.output_len
    chunk_times: list[float] = []
    try:
        async for text, usage in client.chunks(body, chat):
            now = time.perf_counter()
            if usage:
                result.prompt_tokens = usage["prompt_tokens"]
                result.output_tokens = usage["completion_tokens"]
            # A chat stream opens with a chunk that names the role only, and every stream ends
            # with an empty one carrying finish_reason: neither is a token.
            if text:
                chunk_times.append(now)
        end = time.perf_counter()
    except Exception as e:  # noqa: BLE001 - a failed request is a result too
        result.error = f"{type(e).__name__}: {e}"
        return
    if not chunk_times:
        result.error = "no text in the stream"
        return
    result.ok = True
    result.ttft, result.e2e = chunk_times[0] - sent, end - sent
    result.itl = [b - a for a, b in zip(chunk_times, chunk_times[1:])]


async def replay(client_kind: str, base_url: str, model: str, requests: list[Request],
                 arrivals: list[float], label: str | None, start: float | None = None
                 ) -> tuple[list[Result], float]:
    """Send each request at its arrival time (and not before its previous turn ended);
    the results, and the seconds from `start` (a perf_counter reading; default: now) to the
    last answer. No progress bar without a label."""
    from tqdm import tqdm

    client = CLIENTS[client_kind](base_url)
    results = [Result(i, arrival=t) for i, t in enumerate(arrivals)]
    finished = [asyncio.Event() for _ in requests]
    bar = tqdm(total=len(requests), desc=label, unit="req", file=sys.stderr, leave=False,
               disable=None if label else True)  # None: no bar when stderr is not a terminal
    start = time.perf_counter() if start is None else start

    async def one(i: int) -> None:
        try:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            if requests[i].after is not None:
                await finished[requests[i].after].wait()
            await send(client, model, requests[i], results[i], start)
        finally:  # a failed turn must not block the next one forever
            finished[i].set()
            bar.update(1)

    try:
        await asyncio.gather(*(one(i) for i in range(len(requests))))
        duration = time.perf_counter() - start
    finally:
        bar.close()
        await client.close()
    return results, duration


def client_groups(requests: list[Request], n: int) -> list[list[int]]:
    """The requests of each of n client processes, by index: a request goes where the request
    it waits for goes (a user's turns stay together), chains dealt out in turn."""
    root: list[int] = []
    for i, request in enumerate(requests):
        root.append(i if request.after is None else root[request.after])
    roots = list(dict.fromkeys(root))
    groups: list[list[int]] = [[] for _ in range(min(n, len(roots)))]
    process = {r: k % len(groups) for k, r in enumerate(roots)}
    for i, r in enumerate(root):
        groups[process[r]].append(i)
    return groups


def _client_process(k: int, client_kind: str, base_url: str, model: str,
                    requests: list[Request], arrivals: list[float], start: float,
                    results: mp.Queue) -> None:
    """Client process k: its share of the requests. Sends back their results (as dicts: the
    parent's Result is another module's class here), its duration and its own CPU seconds."""
    mine, duration = asyncio.run(replay(client_kind, base_url, model, requests, arrivals, None,
                                        start))
    results.put((k, [asdict(r) for r in mine], duration, time.process_time()))


def replay_in_processes(client_kind: str, base_url: str, model: str, requests: list[Request],
                        arrivals: list[float], label: str, processes: int,
                        on_start: Callable[[], None]) -> tuple[list[Result], float, float]:
    """replay() split over client processes, so that the client's own CPU (parsing every
    chunk of every stream) cannot be what limits a fast server. All processes count time from
    the same instant (perf_counter is the system's monotonic clock, shared by processes), and
    `on_start` runs at that instant (readings of the server's counters before the run).
    The results in request order, the duration, and the clients' CPU seconds in all."""
    if processes <= 1:
        on_start()
        cpu = time.process_time()
        results, duration = asyncio.run(replay(client_kind, base_url, model, requests,
                                               arrivals, label))
        return results, duration, time.process_time() - cpu
    groups = client_groups(requests, processes)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = time.perf_counter() + 3.0  # time for the processes to start and import
    workers = []
    for k, group in enumerate(groups):
        local = {g: j for j, g in enumerate(group)}
        share = [Request(requests[g].prompt, requests[g].output_len,
                         None if requests[g].after is None else local[requests[g].after])
                 for g in group]
        workers.append(ctx.Process(target=_client_process, args=(
            k, client_kind, base_url, model, share, [arrivals[g] for g in group], start, queue)))
    for w in workers:
        w.start()
    print(f"  ……{label}：{len(groups)} 个客户端进程", file=sys.stderr, flush=True)
    time.sleep(max(0.0, start - time.perf_counter()))
    on_start()
    results: list[Result] = [Result(i) for i in range(len(requests))]
    duration = cpu = 0.0
    for _ in workers:
        k, dicts, seconds, cpu_seconds = queue.get()
        duration, cpu = max(duration, seconds), cpu + cpu_seconds
        for i, d in zip(groups[k], dicts):
            results[i] = Result(**{**d, "index": i})
    for w in workers:
        w.join()
    return results, duration, cpu


async def warm_up(client_kind: str, base_url: str, model: str, words: list[str]) -> None:
    """Two short requests at once: the first forward passes (and a first batch of two) are
    slow for reasons no rate should be charged for."""
    rng = random.Random("warm-up")
    client = CLIENTS[client_kind](base_url)
    try:
        results = [Result(i) for i in range(2)]
        await asyncio.gather(*(send(client, model, Request(random_text(rng, words, 16), 4), r, 0.0)
                               for r in results))
        if not all(r.ok for r in results):
            raise RuntimeError(f"预热请求失败：{results[0].error or results[1].error}")
    finally:
        await client.close()


# ----------------------------------------------------------------------------------------------
# Report


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}/s"


def fmt_triple(s: dict, scale: float = 1.0, digits: int = 0) -> str:
    if s["p50"] is None:
        return "—"
    return "/".join(f"{s[f'p{p}'] * scale:.{digits}f}" for p in PERCENTILES)


CLIENT = "客户端"


def cpu_table(runs: list[dict]) -> str:
    """Each process's CPU over each run: the share of one core it used (CPU seconds / the run's
    seconds; 1.0 is a whole core, more only for a process with several busy threads) and its
    CPU microseconds per output token."""
    names = list(dict.fromkeys(name for run in runs for name in run["cpu_s"]))
    rows = [["每个进程的 CPU：占一个核 · 微秒/输出 token", *names]]
    for run in runs:
        cells = [run["label"]]
        for name in names:
            seconds = run["cpu_s"].get(name)
            if seconds is None or run["duration_s"] <= 0:
                cells.append("—")
                continue
            per_token = seconds / run["output_tokens"] * 1e6 if run["output_tokens"] else 0.0
            cells.append(f"{seconds / run['duration_s']:.2f} · {per_token:,.0f}")
        rows.append(cells)
    return aligned(rows)


def table(runs: list[dict]) -> str:
    head = ["", "完成", "用时", "请求/s", "输出 token/s", "TTFT ms p50/90/99",
            "ITL ms p50/90/99", "E2E s p50/90/99"]
    rows = [head] + [[
        run["label"], f"{run['completed']}/{run['completed'] + run['failed']}",
        f"{run['duration_s']:.1f}s", f"{run['request_throughput']:.2f}",
        f"{run['output_throughput']:,.1f}", fmt_triple(run["ttft_ms"]),
        fmt_triple(run["itl_ms"], digits=1), fmt_triple(run["e2e_ms"], 1 / 1000, 2)]
        for run in runs]
    return aligned(rows)


def slug(text: str) -> str:
    """A file-name-safe form of a run or process label."""
    return re.sub(r"[^0-9A-Za-z._-]+", "_", text.replace("速率 ", "rate-")).strip("_")


def every_page_back(stats: dict[str, int]) -> bool:
    """/stats of a server with nothing running or waiting and every KV page free or cached."""
    return ((stats["running"], stats["waiting"], stats["locked_pages"]) == (0, 0, 0)
            and stats["free_pages"] + stats["cached_pages"] == stats["num_pages"])


async def wait_idle(http: httpx.AsyncClient, timeout: float = 30.0) -> dict[str, int]:
    """/stats once every_page_back holds (a request that finished in the batch in flight gives
    its pages back a step later), or the last one after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = await http.get("/stats")
        r.raise_for_status()
        stats = r.json()
        if every_page_back(stats) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.2)


def scheduler_counters(base_url: str) -> dict[str, int]:
    """The scheduler's cumulative time counters from /stats (the loop's idle / receive / step /
    send time, steps by kind); {} for a server that has none."""
    import httpx

    try:
        stats = httpx.get(f"{base_url}/stats", timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {k: v for k, v in stats.items() if isinstance(v, int)
            and k.endswith(("_us", "_steps", "_requests"))}


def scheduler_table(runs: list[dict]) -> str:
    """Rank 0's scheduler loop during each run: the share of its time blocked with nothing to
    do, taking messages, stepping and sending; its steps by kind and their mean time."""
    rows = [["调度器（rank 0）", "空闲", "收消息", "step", "发结果", "prefill 步 · ms/步",
             "decode 步 · 平均 batch · ms/步"]]
    for run in runs:
        c = run["scheduler"]
        if not c:
            continue
        parts = [c.get(f"loop_{k}_us", 0) for k in ("idle", "receive", "step", "send")]
        total = sum(parts) or 1
        per = lambda kind: c[f"{kind}_us"] / 1000 / max(c[f"{kind}_steps"], 1)  # noqa: E731
        rows.append([run["label"], *(f"{x / total:.0%}" for x in parts),
                     f"{c['prefill_steps']} · {per('prefill'):.1f}",
                     f"{c['decode_steps']} · {c['decode_requests'] / max(c['decode_steps'], 1):.0f}"
                     f" · {per('decode'):.2f}"])
    return aligned(rows)


def compare_offline(args: argparse.Namespace, rounds: list[tuple[int, list[Request], object]]
                    ) -> list[dict]:
    """LLM.generate on the same requests (same ids, lengths, greedy, ignore_eos), in this
    process, after the servers have stopped: what the engine computes without the pipeline
    around it. Also its decode step time, from the scheduler's own counters."""
    sys.path.insert(0, str(args.engine_path))
    import torch
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    gpu = torch.cuda.is_available() and (args.device or "cuda").startswith("cuda")
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if gpu else torch.float32)
    print(f"  ……离线对照：LLM.generate，{dtype}，{args.device or '默认设备'}", file=sys.stderr,
          flush=True)
    llm = LLM(args.model, dtype=dtype, **({"device": args.device} if args.device else {}))
    results = []
    try:
        llm.generate([[1, 2, 3, 4]] * 2, SamplingParams(max_tokens=4, ignore_eos=True),
                     progress=False)  # the same warm-up as the server's
        for round_, requests, tokenizer in rounds:
            ids = [prompt_ids(tokenizer, r) for r in requests]
            params = [SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=True)
                      for r in requests]
            scheduler = getattr(llm.backend, "scheduler", None)
            before = scheduler.stats() if scheduler is not None else {}
            start = time.perf_counter()
            outputs = llm.generate(ids, params, progress=False)
            duration = time.perf_counter() - start
            after = scheduler.stats() if scheduler is not None else {}
            steps = after.get("decode_steps", 0) - before.get("decode_steps", 0)
            tokens = sum(len(o["token_ids"]) for o in outputs)
            results.append({
                "round": round_, "output_tokens": tokens, "duration_s": duration,
                "output_throughput": tokens / duration, "decode_steps": steps,
                "decode_ms": ((after["decode_us"] - before["decode_us"]) / 1000 / steps
                              if steps else None),
                "decode_batch": ((after["decode_requests"] - before["decode_requests"]) / steps
                                 if steps else None)})
            print(f"  ……离线 LLM.generate：{tokens:,} 个输出 token，{duration:.1f}s", file=sys.stderr,
                  flush=True)
    finally:
        llm.shutdown()
    return results


def floors(runs: list[dict], offline: list[dict], gpu: bool) -> str:
    """The serving floors, checked on this run's numbers: streamed throughput at rate inf
    ≥ 80% of LLM.generate on the same requests; ITL p50 ≤ 2× the engine's decode step (from
    LLM.generate's own counters); on a GPU, TTFT p50 at 16 req/s ≤ 150 ms."""
    lines = ["下限："]
    mark = lambda ok: "达到" if ok else "未达到"  # noqa: E731
    for o in offline:
        for run in (r for r in runs if r["round"] == o["round"] and r["completed"]):
            ratio = run["output_throughput"] / o["output_throughput"]
            lines.append(f"  {run['label']}：在线 {run['output_throughput']:,.0f} / 离线 "
                         f"{o['output_throughput']:,.0f} 输出 token/s = {ratio:.0%}"
                         f"（≥ {MIN_ONLINE_SHARE:.0%}：{mark(ratio >= MIN_ONLINE_SHARE)}）")
            if o["decode_ms"] and run["itl_ms"]["p50"] is not None:
                itl = run["itl_ms"]["p50"]
                lines.append(f"  {run['label']}：ITL p50 {itl:.1f} ms，引擎 decode 一步 "
                             f"{o['decode_ms']:.2f} ms（平均 batch {o['decode_batch']:.0f}），"
                             f"{itl / o['decode_ms']:.2f} 倍（≤ {MAX_ITL_STEPS:g} 倍："
                             f"{mark(itl <= MAX_ITL_STEPS * o['decode_ms'])}）")
                if (tpot := run["tpot_ms"]["p50"]) is not None:  # a chunk may carry several
                    lines.append(f"  {run['label']}：每个 token 的间隔 TPOT p50 {tpot:.1f} ms，"
                                 f"{tpot / o['decode_ms']:.2f} 倍；平均每块 "
                                 f"{run['output_tokens'] / max(run['chunks'], 1):.2f} 个 token")
    if gpu:
        for run in (r for r in runs if r["rate"] == 16.0 and r["completed"]):
            ttft = run["ttft_ms"]["p50"]
            lines.append(f"  {run['label']}：TTFT p50 {ttft:.0f} ms（≤ {MAX_TTFT_MS:.0f} ms："
                         f"{mark(ttft <= MAX_TTFT_MS)}）")
    return "\n".join(lines) if len(lines) > 1 else ""


def plot(report: dict, path: str) -> None:
    """TTFT, ITL and E2E against the request rate, p50 solid and p99 dashed, a line pair per
    prefix cache, in a PNG; `report` is what --json writes. Log scale: at rate inf the queue
    makes TTFT orders of magnitude longer than at a low rate."""
    from matplotlib.figure import Figure  # without pyplot: Agg draws the PNG, no display needed

    runs = sorted(report["runs"], key=lambda run: run["round"])
    caches = list(dict.fromkeys(run["cache_type"] for run in runs))
    rates = {run["round"]: rate_label(math.inf if run["rate"] == "inf" else run["rate"])
             for run in runs}  # evenly spaced, whatever the rates: inf has no place on an axis
    fig = Figure(figsize=(13, 4.2))
    for ax, (key, title, scale) in zip(fig.subplots(1, 3), [
            ("ttft_ms", "TTFT (ms)", 1.0), ("itl_ms", "ITL (ms)", 1.0),
            ("e2e_ms", "E2E (s)", 1 / 1000)]):
        for color, cache in enumerate(caches):
            mine = [run for run in runs if run["cache_type"] == cache]
            for p, style in (("p50", "-"), ("p99", "--")):
                ax.plot([run["round"] for run in mine],
                        [math.nan if run[key][p] is None else run[key][p] * scale
                         for run in mine], style, marker="o", color=f"C{color}",
                        label=f"{cache} {p}" if len(caches) > 1 else p)
        ax.set_xticks(list(rates), list(rates.values()))
        ax.set(xlabel="request rate", title=title, yscale="log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"{report['model']} · {report['workload']} workload")
    fig.tight_layout()
    fig.savefig(path, dpi=150)



# ----------------------------------------------------------------------------------------------
# Main


def tp_size(argv: list[str]) -> int:
    """The server's TP size (its number of scheduler processes) from its command line."""
    return int(argv[argv.index("--tp") + 1]) if "--tp" in argv else 1


def server_argv(args: argparse.Namespace, cache_type: str, port: int) -> list[str]:
    argv = [sys.executable, "-m", "minisgl", "--model", args.model, "--host", args.host,
            "--port", str(port), "--cache-type", cache_type]
    if args.device:
        argv += ["--device", args.device]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    return argv + shlex.split(args.server_args)


def add_server_options(p: argparse.ArgumentParser) -> None:
    """The server this script starts (or, with --url, the one it measures)."""
    g = p.add_argument_group("server")
    g.add_argument("--url", default=None,
                   help="benchmark a server that is already running (e.g. http://127.0.0.1:1919) "
                        "instead of starting one; the server options below are then ignored")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=0, help="default: any free port")
    g.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: the server's)")
    g.add_argument("--dtype", default=None, help="default: the server's (float32 on the CPU)")
    g.add_argument("--cache-type", default="radix", help="the server's prefix cache")
    g.add_argument("--compare-cache", action="store_true",
                   help="run the server twice, --cache-type radix and naive, side by side")
    g.add_argument("--server-threads", type=int, default=None,
                   help="CPU: the server's PyTorch threads (OMP_NUM_THREADS); default: the "
                        "engine's choice, one per physical core. On a machine busy with other "
                        "work, fewer threads than cores can be much faster (see above)")
    g.add_argument("--server-args", default="",
                   help='more options for python -m minisgl, e.g. "--max-running-req 64 --tp 2"')
    g.add_argument("--startup-timeout", type=float, default=600.0)
    g.add_argument("--engine-path", type=Path, default=ROOT / "python",
                   help="serve the minisgl package under this directory (default: this "
                        "repository's python/), e.g. an older checkout's, to compare versions")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"),
                   help="checkpoint directory (served, and its tokenizer builds the prompts)")
    p.add_argument("--workload", choices=["random", "shared-prefix"], default="random")
    p.add_argument("--rates", type=float, nargs="+", default=None,
                   help="requests per second, each a run of its own; inf sends all at once "
                        "(default: 1 4 inf on the CPU, 8 16 32 inf on cuda)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client-processes", type=int, default=None,
                   help="client processes sharing the requests, so that one client's CPU is "
                        "not the ceiling (default: 1 on the CPU, 4 on cuda)")
    p.add_argument("--client", choices=list(CLIENTS), default="httpx",
                   help="httpx reads the event stream itself; openai is the openai package's "
                        "AsyncOpenAI, which costs the client far more CPU per chunk")
    g = p.add_argument_group("random workload")
    g.add_argument("--num-requests", type=int, default=None, help="default: 16 CPU, 400 cuda")
    g.add_argument("--input-len", type=int, default=None,
                   help="longest prompt in tokens (default: 128 CPU, 1024 cuda)")
    g.add_argument("--output-len", type=int, default=None,
                   help="longest answer in tokens; with shared-prefix every answer has this "
                        "length (default: 32 CPU, 256 cuda)")
    g.add_argument("--range-ratio", type=float, default=0.5,
                   help="lengths are drawn uniformly from [len × ratio, len]; 1 fixes them")
    g = p.add_argument_group("shared-prefix workload")
    g.add_argument("--num-users", type=int, default=None, help="default: 4 CPU, 64 cuda")
    g.add_argument("--turns", type=int, default=None,
                   help="turns per user (default: 3 CPU, 4 cuda)")
    g.add_argument("--system-len", type=int, default=None,
                   help="shared system prompt, in words of one token (default: 256 CPU, 2048 cuda)")
    g.add_argument("--turn-len", type=int, default=None,
                   help="each question, in words of one token (default: 32 CPU, 128 cuda)")
    add_server_options(p)
    g = p.add_argument_group("where the time goes")
    g.add_argument("--profile", metavar="DIR", type=Path, default=None,
                   help="record every server process with py-spy during each run "
                        "(DIR/<run>-<process>.txt; summary: benchmark/pyspy.py)")
    g.add_argument("--compare-offline", action="store_true",
                   help="after the server runs, LLM.generate the requests of each rate-inf run "
                        "in this process (same model, dtype and device) and compare: output "
                        "token/s, and the engine's decode step time against the stream's ITL")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="draw TTFT / ITL / E2E p50 and p99 against the rate into a PNG "
                        "(needs matplotlib)")
    return p


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, bool]:
    """The options, with the defaults of the machine the server runs on; and whether that
    machine is a GPU."""
    parser = build_parser()
    args = parser.parse_args(argv)
    gpu = (args.device or "").startswith("cuda")
    if args.device is None and args.url is None:
        import torch  # the server picks CUDA when it is there: size the workload as it will

        gpu = torch.cuda.is_available()
    for name, value in (GPU_DEFAULTS if gpu else CPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.compare_cache and args.url:
        parser.error("--compare-cache starts its own servers; it cannot be used with --url")
    if not 0 < args.range_ratio <= 1:
        parser.error("--range-ratio must be in (0, 1]")
    if any(r <= 0 for r in args.rates):
        parser.error("--rates must be > 0 (inf for all at once)")
    return args, gpu


def workload(args: argparse.Namespace, words: list[str], round_: int) -> list[Request]:
    """The requests of the round_-th rate: the same lengths every round, other text."""
    if args.workload == "random":
        return random_workload(words, args.num_requests, args.input_len, args.output_len,
                               args.range_ratio, args.seed, round_)
    return shared_prefix_workload(words, args.num_users, args.turns, args.system_len,
                                  args.turn_len, args.output_len, args.seed, round_)


def print_workload(args: argparse.Namespace, argv: list[str] | None, tokenizer,
                   words: list[str]) -> str:
    """Print the machine, the command line, the workload and the rates; return the first."""
    first = workload(args, words, 0)
    ids = [prompt_ids(tokenizer, r) for r in first]
    lens, outs = [len(x) for x in ids], [r.output_len for r in first]
    header = machine_line()
    print(header)
    print("$ python benchmark/online.py "
          + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv)))
    span = lambda xs: f"{min(xs)}–{max(xs)}" if min(xs) < max(xs) else f"每个 {xs[0]}"  # noqa: E731
    description = (f"提示词 {sum(lens):,} 个 token（{span(lens)}），要求输出 {sum(outs):,} 个 "
                   f"token（{span(outs)}），模型 {Path(args.model).name}")
    if args.workload == "random":
        print(f"random 负载：{len(first)} 个请求，{description}")
    else:
        shared = sum(reusable_tokens(ids, first))
        print(f"shared-prefix 负载：{args.num_users} 位用户 × {args.turns} 轮 = {len(first)} 个请求，"
              f"系统提示词 {args.system_len} 个词，每轮提问 {args.turn_len} 个词；{description}；"
              f"其中 {shared:,} 个（{shared / sum(lens):.0%}）是之前的请求算过的前缀（prefix cache "
              f"能省下的上限）")
    print(f"速率：{' '.join(rate_label(r) for r in args.rates)}（泊松到达，种子 {args.seed}）"
          + ("" if not args.server_threads else
             f"；服务器 {args.server_threads} 个 PyTorch 线程（--server-threads）"), flush=True)
    return header


def replay_rate(args: argparse.Namespace, base_url: str, model_name: str,
                requests: list[Request], rate: float, label: str, processes: dict[str, int]
                ) -> tuple[list[Result], float, dict[str, float], dict[str, int]]:
    """Replay `requests` at `rate`: their results, the duration, the CPU seconds of the client
    and of each server process, and the scheduler's counters over the run (py-spy records
    each process meanwhile with --profile)."""
    arrivals = arrival_times(len(requests), rate, args.seed)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    recorders = ([pyspy.start(pid, args.profile / f"{slug(label)}-{slug(name)}.txt")
                  for name, pid in processes.items()] if args.profile else [])
    at_start: dict = {}

    def read_counters() -> None:  # at the run's first instant
        at_start.update(counters=scheduler_counters(base_url), before=snapshot(processes),
                        threads={n: thread_seconds(pid) for n, pid in processes.items()})

    results, duration, client = replay_in_processes(
        args.client, base_url, model_name, requests, arrivals, label,
        args.client_processes, read_counters)
    after = snapshot(processes)
    counters, before, threads = (at_start[k] for k in ("counters", "before", "threads"))
    counters = {k: v - counters[k] for k, v in scheduler_counters(base_url).items()
                if k in counters}
    for error in pyspy.stop(recorders):
        print(f"  ……py-spy：{error}", file=sys.stderr, flush=True)
    if args.profile:  # which threads of each process used the CPU
        for name, pid in processes.items():
            print(f"  ……{label} · {name} 的线程：" + busiest_threads(
                threads[name], thread_seconds(pid), duration), file=sys.stderr, flush=True)
    cpu = {CLIENT: client, **{n: after[n] - before[n] for n in after if n in before}}
    return results, duration, cpu, counters


def measure(args: argparse.Namespace, words: list[str], base_url: str, model_name: str,
            cache: str | None, processes: dict[str, int]) -> list[dict]:
    """Warm the server up, then one run per rate, each on its round's workload."""
    asyncio.run(warm_up(args.client, base_url, model_name, words))
    runs = []
    for round_, rate in enumerate(args.rates):
        label = (f"{cache} · " if args.compare_cache else "") + f"速率 {rate_label(rate)}"
        results, duration, cpu, counters = replay_rate(
            args, base_url, model_name, workload(args, words, round_), rate, label, processes)
        run = {"label": label, "round": round_, "cache_type": cache,
               "rate": "inf" if math.isinf(rate) else rate, **summarize(results, duration),
               "cpu_s": cpu, "scheduler": counters, "requests": [asdict(r) for r in results]}
        runs.append(run)
        failed = [r for r in results if not r.ok]
        print(f"  ……{label}：{duration:.1f}s，完成 {run['completed']}/{len(results)}"
              + (f"，第一个失败：{failed[0].error}" if failed else ""), file=sys.stderr,
              flush=True)
        if not run["exact_output_lengths"]:
            print(f"  ……{label}：有请求的输出 token 数与要求的不同（服务器不支持 ignore_eos？）",
                  file=sys.stderr, flush=True)
    return runs


def served_model(url: str) -> str:
    """The model's name as the server at `url` serves it: other servers may insist on it."""
    import httpx

    try:
        models = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=30).json()
    except (httpx.HTTPError, ValueError) as e:
        raise RuntimeError(f"{url} 没有回答 /v1/models：{e}") from None
    return models["data"][0]["id"]


def stop_server(server: Server) -> None:
    """A second Ctrl-C must not cut the stopping short and leave the server behind."""
    handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.stop()
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def measure_own_servers(args: argparse.Namespace, words: list[str], model_name: str
                        ) -> list[dict]:
    """Start a server for each cache type, measure it, stop it."""
    runs = []
    for cache in ["radix", "naive"] if args.compare_cache else [args.cache_type]:
        argv = server_argv(args, cache, args.port)
        print(f"  ……启动服务器：{' '.join(shlex.quote(a) for a in argv[1:])}",
              file=sys.stderr, flush=True)
        started = time.perf_counter()
        server = Server(argv, args.server_threads, args.engine_path)
        try:
            server.wait_ready(args.startup_timeout)
            print(f"  ……服务器就绪（{time.perf_counter() - started:.1f}s）", file=sys.stderr,
                  flush=True)
            runs += measure(args, words, server.url, model_name, cache,
                            server_processes(server.popen.pid, tp_size(argv)))
            if not server.alive():
                raise RuntimeError(f"服务器在测量中退出了：\n{server.tail()}")
        finally:
            stop_server(server)
    return runs


def print_tables(runs: list[dict]) -> None:
    """Measured server by server; shown rate by rate, so that the caches stand side by side."""
    by_rate = sorted(runs, key=lambda run: run["round"])
    print(table(by_rate))
    print(cpu_table(by_rate))
    if any(run["scheduler"] for run in runs):
        print(scheduler_table(by_rate))


def print_cache_comparison(runs: list[dict], rates: list[float]) -> None:
    """Radix against naive at each rate, in one line each."""
    for round_, rate in enumerate(rates):
        radix, naive = (next(r for r in runs if r["round"] == round_ and r["cache_type"] == c)
                        for c in ("radix", "naive"))
        if not (radix["completed"] and naive["completed"]):
            continue
        print(f"速率 {rate_label(rate)}：TTFT p50 radix {radix['ttft_ms']['p50']:,.0f} ms、"
              f"naive {naive['ttft_ms']['p50']:,.0f} ms，naive/radix = "
              f"{naive['ttft_ms']['p50'] / radix['ttft_ms']['p50']:.2f}；E2E p50 naive/radix = "
              f"{naive['e2e_ms']['p50'] / radix['e2e_ms']['p50']:.2f}；输出 token/s radix/naive = "
              f"{radix['output_throughput'] / naive['output_throughput']:.2f}")


def main(argv: list[str] | None = None) -> int:
    args, gpu = parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    words = single_token_words(tokenizer)
    header = print_workload(args, argv, tokenizer, words)
    report = {"machine": header, "argv": sys.argv[1:] if argv is None else argv,
              "workload": args.workload,
              "options": {k: (list(map(str, v)) if k == "rates" else
                              str(v) if isinstance(v, Path) else v)
                          for k, v in vars(args).items()}}
    return run_to_exit_code(lambda: measure_and_report(args, gpu, tokenizer, words, report))


def measure_and_report(args: argparse.Namespace, gpu: bool, tokenizer, words: list[str],
                       report: dict) -> int:
    """Measure, print the tables (and what the options ask for), save; the exit code."""
    if args.url:
        model_name = served_model(args.url)
        runs = measure(args, words, args.url.rstrip("/"), model_name, None, {})
    else:
        model_name = Path(args.model).name
        runs = measure_own_servers(args, words, model_name)
    print_tables(runs)
    offline: list[dict] = []
    if args.compare_offline:
        offline = compare_offline(args, [(round_, workload(args, words, round_), tokenizer)
                                         for round_, rate in enumerate(args.rates)
                                         if math.isinf(rate)])
    if (lines := floors(runs, offline, gpu)):
        print(lines)
    if args.profile:
        for path in sorted(args.profile.glob("*.txt")):
            print(pyspy.summary(path, top=15))
    if args.compare_cache:
        print_cache_comparison(runs, args.rates)
    save({**report, "model": model_name, "runs": runs, "offline": offline}, args.json,
         args.plot, plot)
    return 0 if all(run["failed"] == 0 for run in runs) else 1

if __name__ == "__main__":
    sys.exit(main())
