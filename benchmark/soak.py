"""长跑（soak）：让 CPU 上的 `python -m minisgl` 在一份有界的混合负载下连续跑 --duration 秒，
看它的内存和文件描述符是否平稳，KV 页是否一页不少地回来，除了要求的拒绝有没有别的错误。

负载：--clients 个客户端同时在跑（有界：任何时刻最多这么多个请求），每个客户端发完一个再发下一个。
每个请求随机决定：
  - 流式还是非流式（各一半），走 /v1/completions 还是 /v1/chat/completions（各一半）；
  - 提示词 = --prefixes 段共享前缀之一（每段 --prefix-len 个 token）+ 一段随机长度的尾巴，
    输出 1 到 --output-len 个 token。长度抽到超过上下文（提示词 + 输出 > 服务器的 --max-seq-len）
    的请求必须被拒绝：400，错误信息里有 max_seq_len——这是要求的拒绝，其余都必须成功；
  - 流式请求里有 --leave-share（默认 25%）收到一两块就断开（客户端走掉）。
KV 池故意开小（--num-pages），radix cache 很快装满，之后每个新请求都要逐出别人的前缀。

正式开始前，每种请求先各发一个（把懒加载的东西都加载好），等服务器空闲、连接都关掉后，记下
每个进程打开的文件描述符数作为基线。之后每隔 --interval 秒记一次服务器每个进程（API Server、调度器、
tokenizer）的常驻内存（RSS，/proc/PID/statm）和打开的文件描述符数（/proc/PID/fd），以及
/stats 的 KV 页和请求数。结束时停下客户端，等服务器空闲，然后检查：

  1. 每一页 KV 都回来了：free + cached == num_pages，没有锁住的页，没有在跑或排队的请求；
  2. 除了要求的拒绝，没有任何错误（非 200、断流、token 数或 finish_reason 不对都算）；
  3. 负载真的让 radix cache 逐出过（/stats 的 evicted_pages 不是 0）；
  4. 空闲、没有连接时每个进程打开的文件描述符数与开始前的基线相同；
  5. 内存在预热之后是平的：预热（--warm-up 秒，默认全程的四分之一）之后的窗口里，每个进程
     最后 10% 采样的 RSS 中位数，比窗口开头 10% 采样的中位数多出不超过容差
     max(--tolerance-mib MiB, --tolerance-share × 开头的 RSS)，默认 max(8 MiB, 2%)。泄漏随
     请求数线性增长，每个请求漏 2 KB，窗口里四千个请求就超出 8 MiB；分配器的碎片、PyTorch 在
     CPU 上按形状留下的缓冲，则在预热里涨到头就不再涨。报告里另给出窗口内平均每个请求涨了
     多少字节。

全部满足时退出码 0，否则 1。--json 存下全部采样与结论，--plot 画成 PNG（RSS 的变化、文件描述符、
KV 页三张随时间的曲线；预热一段涂灰，RSS 的容差画成虚线）；--from-json 从存下的 JSON 重画。

    python benchmark/soak.py --duration 1200 --json soak.json --plot soak.png   # 20 分钟
    python benchmark/soak.py --duration 15 --warm-up 5 --interval 0.5           # CI 里的短版
    python benchmark/soak.py --from-json soak.json --plot soak.png

默认模型是 tiny-qwen3（随机权重的小模型）：测的是服务器的簿记，不是模型，轻一点的模型能在同样
的时间里跑更多请求，也不挤占机器上的别的任务。
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from online import (Request, Server, every_page_back, prompt_ids, random_text,
                    single_token_words, stop_server, wait_idle)
from process_cpu import server_processes
from report import machine_line, run_to_exit_code, save

ROOT = Path(__file__).resolve().parent.parent
# The names the plot uses (its machine may have no CJK font).
PLOT_NAMES = {"API Server（启动者）": "API server"}
MIB = 1 << 20
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
ERRORS_KEPT = 20  # the first errors are printed and saved; the rest are counted


# ----------------------------------------------------------------------------------------------
# The workload (pure: no server)


@dataclass
class SoakRequest:
    prompt: str | list[dict[str, str]]  # text for /v1/completions, messages for chat
    prompt_tokens: int  # as the server will count them
    max_tokens: int
    stream: bool
    leave_after: int | None  # a stream read this many chunks, then dropped; None: read whole
    rejected: bool  # too long for the context: the server must answer 400

    @property
    def chat(self) -> bool:
        return not isinstance(self.prompt, str)


@dataclass(frozen=True)
class Mix:
    prefixes: list[str]  # the shared prompt prefixes, as text
    max_seq_len: int
    output_len: int
    leave_share: float
    longest_tail: int  # tokens after the prefix: prompts reach the context's end, or pass it


def draw_request(rng: random.Random, words: list[str], mix: Mix, tokenizer) -> SoakRequest:
    """One request of the mix; its prompt is counted with the server's tokenizer, so that
    whether it must be rejected is known exactly (fit_max_tokens: prompt + max_tokens must fit
    max_seq_len)."""
    prefix = rng.choice(mix.prefixes)
    tail = random_text(rng, words, rng.randint(1, mix.longest_tail))
    chat = rng.random() < 0.5
    prompt: str | list[dict[str, str]] = (
        [{"role": "system", "content": prefix}, {"role": "user", "content": tail}]
        if chat else prefix + tail)
    prompt_tokens = len(prompt_ids(tokenizer, Request(prompt, 0)))
    max_tokens = rng.randint(1, mix.output_len)
    stream = rng.random() < 0.5
    leave = stream and rng.random() < mix.leave_share
    return SoakRequest(prompt, prompt_tokens, max_tokens, stream,
                       rng.randint(1, 2) if leave else None,
                       prompt_tokens + max_tokens > mix.max_seq_len)


# ----------------------------------------------------------------------------------------------
# The clients


@dataclass
class Tally:
    """What the clients saw, request by request."""

    completed: int = 0
    rejected: int = 0  # the asked-for 400s
    left: int = 0  # streams the client dropped on purpose
    errors: list[str] = field(default_factory=list)
    error_count: int = 0

    @property
    def sent(self) -> int:
        return self.completed + self.rejected + self.left + self.error_count

    def error(self, what: str) -> None:
        self.error_count += 1
        if len(self.errors) < ERRORS_KEPT:
            self.errors.append(what)


def check_usage(req: SoakRequest, usage: dict | None, finish: str | None) -> str | None:
    """Why a completed answer is wrong, or None: the server's prompt count, and an answer that
    stops at max_tokens ("length") or sooner at an end-of-sequence token ("stop")."""
    if usage is None:
        return "no usage"
    if usage["prompt_tokens"] != req.prompt_tokens:
        return f"prompt_tokens {usage['prompt_tokens']}, expected {req.prompt_tokens}"
    done = usage["completion_tokens"]
    if not (finish == "length" and done == req.max_tokens
            or finish == "stop" and 1 <= done <= req.max_tokens):
        return f"finish_reason {finish} after {done} of {req.max_tokens} tokens"
    return None


async def read_stream(response, req: SoakRequest) -> str | None:
    """A streamed answer: None once read whole and right; "left" if dropped on purpose."""
    usage, finish, chunks, done = None, None, 0, False
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        if chunk["choices"]:
            chunks += 1
            finish = chunk["choices"][0]["finish_reason"] or finish
        if req.leave_after is not None and chunks >= req.leave_after and finish is None:
            return "left"  # leaving the `async with` closes the connection mid-stream
    return check_usage(req, usage, finish) if done else "the stream ended without [DONE]"


async def send(http, req: SoakRequest, tally: Tally) -> None:
    body = {"max_tokens": req.max_tokens, "stream": req.stream, "temperature": 1.0,
            ("messages" if req.chat else "prompt"): req.prompt}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if req.chat else "/v1/completions"
    kind = f"{'chat' if req.chat else 'completion'} {'stream' if req.stream else 'whole'}"
    try:
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200 or req.rejected:
                text = (await response.aread()).decode(errors="replace")
                refused = response.status_code == 400 and "max_seq_len" in text
                if req.rejected and refused:
                    tally.rejected += 1
                else:
                    tally.error(f"{kind}, {req.prompt_tokens}+{req.max_tokens} tokens: HTTP "
                                f"{response.status_code} {text[:200]}")
                return
            if req.stream:
                problem = await read_stream(response, req)
            else:
                answer = json.loads(await response.aread())
                problem = check_usage(req, answer.get("usage"),
                                      answer["choices"][0]["finish_reason"])
    except Exception as e:  # noqa: BLE001 - a broken connection is a finding, not a crash
        problem = f"{type(e).__name__}: {e}"
    if problem == "left":
        tally.left += 1
    elif problem is None:
        tally.completed += 1
    else:
        tally.error(f"{kind}, {req.prompt_tokens}+{req.max_tokens} tokens: {problem}")


async def client(url: str, requests, until: float, tally: Tally) -> None:
    """Requests one after another until `until` (time.monotonic()). Its own connection, as a
    user's program would have; a dropped stream takes it down and the next request opens one."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        while time.monotonic() < until:
            await send(http, next(requests), tally)


# ----------------------------------------------------------------------------------------------
# Sampling the server's processes


def rss_bytes(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES
    except (FileNotFoundError, ProcessLookupError):
        return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None


def sample(processes: dict[str, int], stats: dict[str, int], start: float,
           tally: Tally) -> dict:
    """One point of the curves: seconds since `start`, each process's RSS (MiB) and open fds,
    the scheduler's pages and requests, and the requests answered so far."""
    return {"t": time.monotonic() - start,
            "rss_mib": {n: b / MIB for n, p in processes.items()
                        if (b := rss_bytes(p)) is not None},
            "fds": {n: f for n, p in processes.items() if (f := open_fds(p)) is not None},
            **{k: stats[k] for k in ("free_pages", "cached_pages", "evicted_pages", "running",
                                     "waiting")},
            "answered": tally.sent}


async def get_stats(http) -> dict[str, int]:
    r = await http.get("/stats")
    r.raise_for_status()
    return r.json()


def http_connections(pid: int, port: int) -> int:
    """The connections to the server's HTTP `port` that `pid` holds open, from /proc: its
    sockets in the TCP tables whose local port it is, except the listening one."""
    try:
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        tables = [Path(f"/proc/{pid}/net/{t}").read_text() for t in ("tcp", "tcp6")]
    except (FileNotFoundError, ProcessLookupError):
        return 0
    rows = [line.split() for table in tables for line in table.splitlines()[1:]]
    # A row: slot, local address:port (hex), remote, state (0A: listening), ..., inode (10th).
    return sum(int(row[1].rsplit(":", 1)[1], 16) == port and row[3] != "0A"
               and f"socket:[{row[9]}]" in sockets for row in rows)


async def idle_fds(processes: dict[str, int], port: int, timeout: float = 10.0
                   ) -> dict[str, int]:
    """Open fds per process once no client is connected: called with every client closed, it
    waits until the server has closed its end of each connection too (a moment after the
    client's), or `timeout` (a connection the server never closes is then counted)."""
    deadline = time.monotonic() + timeout
    while (any(http_connections(pid, port) for pid in processes.values())
           and time.monotonic() < deadline):
        await asyncio.sleep(0.05)
    return {n: f for n, p in processes.items() if (f := open_fds(p)) is not None}


# ----------------------------------------------------------------------------------------------
# The verdict (pure)


def rss_growth(samples: list[dict], warm_up: float, name: str) -> tuple[float, float]:
    """(RSS at the start of the measured window, its growth to the end), in MiB: the medians
    of the window's first and last 10% of samples (at least three each), so that one sample
    taken in the middle of a big step does not decide."""
    window = [s["rss_mib"][name] for s in samples if s["t"] >= warm_up and name in s["rss_mib"]]
    if len(window) < 6:
        raise ValueError(f"{len(window)} samples after the warm-up: too few to judge "
                         "(a longer --duration or a shorter --interval)")
    n = max(3, len(window) // 10)
    start = statistics.median(window[:n])
    return start, statistics.median(window[-n:]) - start


def verdict(report: dict) -> list[str]:
    """The failed checks, each a line; none: the server passed."""
    o, end = report["options"], report["end"]
    failures = []
    stats = end["stats"]
    if not every_page_back(stats):
        failures.append(f"KV 页没有全部回来：{stats}")
    if report["tally"]["error_count"]:
        failures.append(f"{report['tally']['error_count']} 个请求出错（要求的拒绝之外）")
    if not stats["evicted_pages"]:
        failures.append("radix cache 一页也没有逐出：负载没有测到逐出（加大负载或减小 --num-pages）")
    if end["fds"] != report["baseline_fds"]:
        failures.append(f"空闲时打开的文件描述符 {end['fds']}，开始前 {report['baseline_fds']}")
    for name, (start, growth) in report["rss"].items():
        limit = max(o["tolerance_mib"], o["tolerance_share"] * start)
        if growth > limit:
            failures.append(f"{name} 预热后 RSS 涨了 {growth:.1f} MiB（从 {start:.1f}），容差 "
                            f"{limit:.1f} MiB")
    return failures


# ----------------------------------------------------------------------------------------------
# The run


def requests_forever(seed: int, words: list[str], mix: Mix, tokenizer):
    rng = random.Random(seed)
    while True:
        yield draw_request(rng, words, mix, tokenizer)


def prime(words: list[str], mix: Mix, tokenizer) -> list[SoakRequest]:
    """One request of each kind (chat or not, stream or not, dropped, rejected), before the
    baseline: whatever a kind loads on first use is loaded by then."""
    rng = random.Random("prime")
    prefix = mix.prefixes[0] + random_text(rng, words, 8)
    kinds = []
    for prompt in (prefix, [{"role": "user", "content": prefix}]):
        n = len(prompt_ids(tokenizer, Request(prompt, 0)))
        kinds += [SoakRequest(prompt, n, 4, False, None, False),
                  SoakRequest(prompt, n, 4, True, None, False),
                  SoakRequest(prompt, n, 64, True, 1, False),
                  SoakRequest(prompt, n, mix.max_seq_len, False, None, True)]
    return kinds


async def soak(url: str, processes: dict[str, int], args: argparse.Namespace,
               words: list[str], mix: Mix, tokenizer) -> dict:
    """Prime, take the baseline, run the clients and sample, then wait for the server to be
    idle and look again. The report (without its verdict)."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        primer = Tally()
        for req in prime(words, mix, tokenizer):
            await send(http, req, primer)
        if primer.error_count:
            raise RuntimeError(f"预备请求出错：{primer.errors}")
        await wait_idle(http, 30)
    port = urlparse(url).port
    baseline = await idle_fds(processes, port)  # ours closed: no connection counts
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        tally, samples = Tally(), []
        start = time.monotonic()
        until = start + args.duration
        requests = requests_forever(args.seed, words, mix, tokenizer)
        clients = [asyncio.create_task(client(url, requests, until, tally))
                   for _ in range(args.clients)]
        while not all(c.done() for c in clients):
            samples.append(sample(processes, await get_stats(http), start, tally))
            print(f"\r  ……{samples[-1]['t']:5.0f}s：{tally.sent:,} 个请求", end="",
                  file=sys.stderr, flush=True)
            await asyncio.wait(clients, timeout=args.interval)
        print(file=sys.stderr)
        for c in clients:
            c.result()  # a client that crashed is the script's bug: say so
        stats = await wait_idle(http, 30)
    end = {"stats": stats, "fds": await idle_fds(processes, port),
           "seconds": time.monotonic() - start}
    samples.append(sample(processes, stats, start, tally))
    rss = {name: rss_growth(samples, args.warm_up, name) for name in processes}
    return {"baseline_fds": baseline, "samples": samples, "end": end, "tally": asdict(tally),
            "rss": rss}


def print_report(report: dict) -> None:
    t, end, o = report["tally"], report["end"], report["options"]
    sent = t["completed"] + t["rejected"] + t["left"] + t["error_count"]
    print(f"{end['seconds']:.0f} 秒，{o['clients']} 个客户端：发出 {sent:,} 个请求，完成 "
          f"{t['completed']:,}，按要求拒绝 {t['rejected']:,}，中途断开 {t['left']:,}，"
          f"出错 {t['error_count']:,}")
    for error in t["errors"]:
        print(f"  出错：{error}")
    s = end["stats"]
    print(f"KV 页：{s['num_pages']:,} 页，结束时空闲 {s['free_pages']:,} + radix cache "
          f"{s['cached_pages']:,}，锁住 {s['locked_pages']}；radix cache 一共逐出 "
          f"{s['evicted_pages']:,} 页（池子的 {s['evicted_pages'] / s['num_pages']:.0f} 倍）")
    window = [x for x in report["samples"] if x["t"] >= o["warm_up"]]
    answered = window[-1]["answered"] - window[0]["answered"]
    print(f"预热 {o['warm_up']:.0f} 秒之后的窗口（{answered:,} 个请求）里的 RSS（MiB，窗口开头 → "
          f"结尾的中位数；容差 max({o['tolerance_mib']:g} MiB, {o['tolerance_share']:.0%})），"
          "与打开的文件描述符：")
    for name, (start, growth) in report["rss"].items():
        peak = max(x["rss_mib"].get(name, 0) for x in report["samples"])
        fds = [x["fds"][name] for x in report["samples"] if name in x["fds"]]
        print(f"  {name}：RSS {start:.1f} → {start + growth:.1f}（{growth:+.1f}，每个请求 "
              f"{growth * MIB / max(answered, 1):+,.0f} 字节），峰值 {peak:.1f}；fd 开始前 "
              f"{report['baseline_fds'].get(name)}、结束后 {end['fds'].get(name)}，负载中 "
              f"{min(fds)}–{max(fds)}")
    failures = report["failures"]
    print("结论：" + ("全部通过" if not failures else "；".join(failures)))


def plot(report: dict, path: str) -> None:
    """Each process's RSS as a change from where the measured window starts, with its tolerance
    dashed; open fds; the KV pages. Against minutes, the warm-up shaded."""
    from matplotlib.figure import Figure  # without pyplot: Agg draws the PNG, no display needed

    samples, o = report["samples"], report["options"]
    minutes = [s["t"] / 60 for s in samples]
    fig = Figure(figsize=(11, 8.5))
    rss_ax, fd_ax, kv_ax = fig.subplots(3, 1, sharex=True)
    for i, (name, (start, _)) in enumerate(report["rss"].items()):
        label = PLOT_NAMES.get(name, name)
        rss_ax.plot(minutes, [s["rss_mib"][name] - start if name in s["rss_mib"] else None
                              for s in samples], color=f"C{i}", label=f"{label} ({start:.0f} MiB)")
        limit = max(o["tolerance_mib"], o["tolerance_share"] * start)
        rss_ax.hlines(limit, o["warm_up"] / 60, minutes[-1], colors=f"C{i}", linestyles="--")
        fd_ax.plot(minutes, [s["fds"].get(name) for s in samples], color=f"C{i}", label=label)
    kv_ax.plot(minutes, [s["free_pages"] for s in samples], label="free pages")
    kv_ax.plot(minutes, [s["cached_pages"] for s in samples], label="pages in the radix cache")
    evicted_ax = kv_ax.twinx()
    evicted_ax.plot(minutes, [s["evicted_pages"] / 1000 for s in samples], color="C3")
    evicted_ax.set_ylabel("thousands evicted so far (red)", fontsize=8)
    for ax, title in ((rss_ax, "resident memory minus its value when the warm-up ends (MiB); "
                               "dashed: tolerance"),
                      (fd_ax, "open file descriptors"), (kv_ax, "KV pages")):
        ax.axvspan(0, o["warm_up"] / 60, color="grey", alpha=0.15)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    kv_ax.set_xlabel("minutes (grey: warm-up)")
    t = report["tally"]
    fig.suptitle(f"{report['model']} soak: {o['clients']} clients, {t['completed']:,} completed, "
                 f"{t['rejected']:,} rejected, {t['left']:,} dropped mid-stream, "
                 f"{t['error_count']} errors")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


# ----------------------------------------------------------------------------------------------
# Main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/tiny-qwen3",
                   help="checkpoint directory; a relative path starts at the repository")
    p.add_argument("--duration", type=float, default=1200.0, help="seconds of load")
    p.add_argument("--warm-up", type=float, default=None,
                   help="seconds at the start that the memory check leaves out "
                        "(default: a quarter of --duration)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--clients", type=int, default=8, help="requests in flight at most")
    p.add_argument("--prefixes", type=int, default=4, help="shared prompt prefixes")
    p.add_argument("--prefix-len", type=int, default=128, help="tokens of each prefix")
    p.add_argument("--output-len", type=int, default=64, help="longest answer in tokens")
    p.add_argument("--leave-share", type=float, default=0.25,
                   help="streams the client drops after a chunk or two")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance-mib", type=float, default=8.0)
    p.add_argument("--tolerance-share", type=float, default=0.02)
    g = p.add_argument_group("server")
    g.add_argument("--max-seq-len", type=int, default=512)
    g.add_argument("--num-pages", type=int, default=2048, help="a small KV pool: eviction")
    g.add_argument("--server-threads", type=int, default=1,
                   help="the server's PyTorch threads (OMP_NUM_THREADS)")
    g.add_argument("--server-args", default="", help="more options for python -m minisgl")
    g.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--json", metavar="PATH", default=None)
    p.add_argument("--plot", metavar="PATH", default=None)
    p.add_argument("--from-json", metavar="PATH", default=None,
                   help="draw --plot from a saved --json instead of running")
    return p


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """Start the server, soak it, stop it: the report, verdict included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / args.model)
    words = single_token_words(tokenizer)
    rng = random.Random(f"{args.seed}:prefixes")
    mix = Mix([random_text(rng, words, args.prefix_len) for _ in range(args.prefixes)],
              args.max_seq_len, args.output_len, args.leave_share,
              args.max_seq_len - args.prefix_len)
    server = Server([sys.executable, "-m", "minisgl", "--model", args.model, "--port", "0",
                     "--max-seq-len", str(args.max_seq_len), "--num-pages", str(args.num_pages),
                     *shlex.split(args.server_args)], args.server_threads)
    try:
        server.wait_ready(args.startup_timeout)
        processes = server_processes(server.popen.pid, 1)
        report = asyncio.run(soak(server.url, processes, args, words, mix, tokenizer))
        if not server.alive():
            raise RuntimeError(f"服务器在长跑中退出了：\n{server.tail()}")
    finally:
        stop_server(server)
    report = {"machine": machine_line(), "argv": argv, "model": Path(args.model).name,
              "options": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
              **report}
    report["failures"] = verdict(report)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        save(report, None, args.plot, plot)
        return 0
    if args.warm_up is None:
        args.warm_up = args.duration / 4
    print(machine_line())
    print(" ".join(["$ python benchmark/soak.py", *map(shlex.quote, argv)]), flush=True)
    return run_to_exit_code(lambda: finish(run(args, argv), args))


def finish(report: dict, args: argparse.Namespace) -> int:
    """Print and save the report; the exit code."""
    print_report(report)
    save(report, args.json, args.plot, plot)
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
