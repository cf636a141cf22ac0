"""过载：同时发出 --requests 个请求（默认 2,000），远远超过 KV 池一次装得下的，看服务器怎样排队、
怎样拒绝。

服务器的 KV 池开小（--num-pages），每个请求的提示词和输出长度固定（--input-len、--output-len，
ignore_eos），所以池子一次只装得下 num_pages ÷ (input-len + output-len) 个请求，其余的在调度器的
队列里等页面空出来。对 --bounds 里的每个值（服务器的 --max-queued-req：最多多少个请求在等第一个
token）起一次服务器，先同时发出同样多个 GET /health（API Server 接下这么多连接、答一个最简单
的请求要多久：503 快不过它），再把全部请求同时发出（asyncio + httpx，一个请求一个连接，不重试），
一边每 0.2 秒读一次 /stats（在跑的、排队的请求数，空闲页），一边等每个请求的答复，然后检查：

  - 每个请求都有答复：200，或者 503——没有第三种结果，没有悄悄丢掉的请求；
  - 每个 200 的输出正好 --output-len 个 token（被接受的全部做完）；
  - 每个 503 是 OpenAI 格式的错误（type 是 server_error，信息里写着 --max-queued-req），
    并记下它们来得多快（从发出到收到的分位数）；
  - bound 不小于请求数时一个 503 也没有；
  - 结束后 KV 页全部回来（free + cached == num_pages，没有锁住的页）。

全部满足时退出码 0，否则 1。

    python benchmark/overload.py                                  # CPU：tiny-qwen3，2,000 个请求
    python benchmark/overload.py --requests 200 --bounds 4096 20  # 小一点
    python benchmark/overload.py --device cuda --model models/qwen3-0.6b-random --input-len 512 \\
        --output-len 64 --num-pages 16384
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from online import (Server, every_page_back, percentile, random_text, single_token_words,
                    stop_server, wait_idle)
from report import aligned, machine_line, run_to_exit_code

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Answer:
    status: int  # 0: no HTTP answer at all (the connection broke)
    seconds: float
    body: dict | None
    error: str = ""


async def post(http, body: dict) -> Answer:
    start = time.perf_counter()
    try:
        r = await http.post("/v1/completions", json=body)
        parsed = r.json()
    except Exception as e:  # noqa: BLE001 - a request without an answer is what we look for
        return Answer(0, time.perf_counter() - start, None, f"{type(e).__name__}: {e}")
    return Answer(r.status_code, time.perf_counter() - start, parsed)


async def watch(url: str, ready: asyncio.Event, stop: asyncio.Event,
                seen: dict[str, int]) -> None:
    """Every 0.2 s until `stop`: the largest number of requests running and waiting, and the
    fewest free pages, the scheduler reported. On a connection of its own, open (`ready`)
    before the burst starts: a new one would wait behind the burst's to be accepted."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=None) as http:
        while not stop.is_set():
            try:
                stats = (await http.get("/stats")).json()
            except httpx.TransportError:  # closed by the server's keep-alive timeout: again
                continue
            ready.set()
            note(seen, stats)
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass


def note(seen: dict[str, int], stats: dict[str, int]) -> None:
    seen["running"] = max(seen.get("running", 0), stats["running"])
    seen["waiting"] = max(seen.get("waiting", 0), stats["waiting"])
    seen["free_pages"] = min(seen.get("free_pages", stats["num_pages"]), stats["free_pages"])


@dataclass
class Burst:
    answers: list[Answer]
    seconds: float  # until the last answer
    seen: dict[str, int]  # the most running and waiting, the fewest free pages, meanwhile
    idle: dict[str, int]  # /stats once the server is idle again
    health_s: list[float]  # as many GET /health at once, before: what any answer costs


async def seconds_to_answer(http, path: str) -> float:
    start = time.perf_counter()
    (await http.get(path)).raise_for_status()
    return time.perf_counter() - start


async def burst(url: str, prompts: list[str], output_len: int) -> Burst:
    """First as many GET /health at once as there are prompts (how fast the API server
    answers anything), then every prompt at once, watching /stats."""
    import httpx

    # A connection per request, as from 2,000 clients; none is reused, so none can be closed
    # by the server's keep-alive timeout just as a request goes out on it.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:
        health = await asyncio.gather(*[seconds_to_answer(http, "/health") for _ in prompts])
        ready, stop, seen = asyncio.Event(), asyncio.Event(), {}
        watcher = asyncio.create_task(watch(url, ready, stop, seen))
        await ready.wait()
        start = time.perf_counter()
        answers = await asyncio.gather(*[post(http, {
            "prompt": p, "max_tokens": output_len, "ignore_eos": True, "temperature": 0})
            for p in prompts])
        seconds = time.perf_counter() - start
        stop.set()
        await watcher
        return Burst(answers, seconds, seen, await wait_idle(http), health)


def judge(answers: list[Answer], output_len: int, bound: int) -> tuple[dict, list[str]]:
    """The counts, and what is wrong (each a line; none: the server passed)."""
    done = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 503]
    problems = []
    if other := [a for a in answers if a.status not in (200, 503)]:
        problems.append(f"{len(other)} 个请求既不是 200 也不是 503，例如 "
                        f"{other[0].status} {other[0].error or json.dumps(other[0].body)[:200]}")
    if short := [a for a in done if a.body["usage"]["completion_tokens"] != output_len]:
        problems.append(f"{len(short)} 个完成的请求输出不是 {output_len} 个 token")
    if wrong := [a for a in refused if a.body.get("error", {}).get("type") != "server_error"
                 or "--max-queued-req" not in a.body["error"].get("message", "")]:
        problems.append(f"{len(wrong)} 个 503 不是 OpenAI 格式的过载错误，例如 {wrong[0].body}")
    if refused and bound >= len(answers):
        problems.append(f"队列上限 {bound:,} 不小于请求数，却有 {len(refused)} 个 503")
    counts = {"sent": len(answers), "completed": len(done), "refused": len(refused),
              "other": len(answers) - len(done) - len(refused),
              "ok_s": [a.seconds for a in done], "refused_s": [a.seconds for a in refused],
              "refused_example": refused[0].body if refused else None}
    return counts, problems


def quantiles(seconds: list[float]) -> str:
    if not seconds:
        return "-"
    return "/".join(f"{percentile(seconds, p) * 1000:,.0f}" for p in (50, 99, 100))


def run_bound(args: argparse.Namespace, prompts: list[str], bound: int) -> dict:
    """One server with --max-queued-req `bound`: the burst, judged."""
    argv = [sys.executable, "-m", "minisgl", "--model", args.model, "--port", "0",
            "--num-pages", str(args.num_pages), "--max-queued-req", str(bound),
            *(["--device", args.device] if args.device else []), *shlex.split(args.server_args)]
    print(f"  ……启动服务器：{' '.join(shlex.quote(a) for a in argv[1:])}", file=sys.stderr,
          flush=True)
    server = Server(argv, args.server_threads)
    try:
        server.wait_ready(args.startup_timeout)
        run = asyncio.run(burst(server.url, prompts, args.output_len))
        if not server.alive():
            raise RuntimeError(f"服务器在过载中退出了：\n{server.tail()}")
    finally:
        stop_server(server)
    counts, problems = judge(run.answers, args.output_len, bound)
    if not every_page_back(run.idle):
        problems.append(f"KV 页没有全部回来：{run.idle}")
    return {"bound": bound, "seconds": run.seconds, "seen": run.seen, "idle": run.idle,
            "health_s": run.health_s, **counts, "problems": problems}


def table(runs: list[dict]) -> str:
    rows = [["--max-queued-req", "发出", "完成", "503", "其他", "用时", "完成的用时 ms p50/99/max",
             "503 的用时 ms p50/99/max", "同样多的 /health", "最多在跑", "最多排队", "最少空闲页"]]
    for run in runs:
        rows.append([f"{run['bound']:,}", f"{run['sent']:,}", f"{run['completed']:,}",
                     f"{run['refused']:,}", f"{run['other']:,}", f"{run['seconds']:.1f}s",
                     quantiles(run["ok_s"]), quantiles(run["refused_s"]),
                     quantiles(run["health_s"]),
                     f"{run['seen'].get('running', 0):,}", f"{run['seen'].get('waiting', 0):,}",
                     f"{run['seen'].get('free_pages', 0):,}"])
    return aligned(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/tiny-qwen3",
                   help="checkpoint directory; a relative path starts at the repository")
    p.add_argument("--requests", type=int, default=2000, help="sent at once")
    p.add_argument("--input-len", type=int, default=32, help="prompt tokens of every request")
    p.add_argument("--output-len", type=int, default=16, help="answer tokens of every request")
    p.add_argument("--bounds", type=int, nargs="+", default=[4096, 100],
                   help="the server's --max-queued-req, one run each")
    p.add_argument("--num-pages", type=int, default=512,
                   help="the server's KV pool: far fewer pages than the burst needs")
    p.add_argument("--device", default=None, help="the server's (default: its own choice)")
    p.add_argument("--server-threads", type=int, default=None,
                   help="CPU: the server's PyTorch threads (OMP_NUM_THREADS)")
    p.add_argument("--server-args", default="", help="more options for python -m minisgl")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    from transformers import AutoTokenizer

    words = single_token_words(AutoTokenizer.from_pretrained(ROOT / args.model))
    rng = random.Random(args.seed)  # distinct prompts: no prefix is shared
    prompts = [random_text(rng, words, args.input_len) for _ in range(args.requests)]
    print(machine_line())
    print(" ".join(["$ python benchmark/overload.py", *map(shlex.quote, argv)]))
    need = args.requests * (args.input_len + args.output_len)
    print(f"{args.requests:,} 个请求同时发出，每个提示词 {args.input_len}、输出 {args.output_len} 个 "
          f"token，模型 {Path(args.model).name}；KV 池 {args.num_pages:,} 页（页大小 1），一次装得下 "
          f"{args.num_pages // (args.input_len + args.output_len):,} 个请求，全部要 {need:,} 页",
          flush=True)
    return run_to_exit_code(lambda: finish([run_bound(args, prompts, b) for b in args.bounds]))


def finish(runs: list[dict]) -> int:
    """Print the runs and the verdict; the exit code."""
    print(table(runs))
    for run in runs:
        if run["refused_example"]:
            print(f"--max-queued-req {run['bound']:,} 的 503 之一："
                  f"{json.dumps(run['refused_example'], ensure_ascii=False)}")
    problems = [f"--max-queued-req {run['bound']:,}：{p}" for run in runs for p in run["problems"]]
    print("结论：" + ("全部通过" if not problems else "；".join(problems)))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
