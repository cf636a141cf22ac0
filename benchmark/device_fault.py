"""设备故障：让服务器的一步故意失败，看它怎样收场。

MINISGL_DEBUG_FAULT_STEP=N（scheduler/fault.py）让调度器在第 N 步之前把页表里每个在跑请求的
第一个 KV 槽位改成池外的 2^31−1：这一步的注意力越界读，CPU 上是 IndexError，GPU 上是非法内存
访问（decode 步在 CUDA Graph 的回放里）。脚本带着这个变量起一个 `python -m minisgl`，同时开
--streams 个流式请求（每个要的输出都长到跑不完），然后等服务器自己退出，记下：

  - 日志里以 "minisgl:" 开头的行（启动者说哪个进程退出了：哪一步、什么错误），
    以及日志一共多少行、几个 Traceback；
  - 退出码（必须非 0），从第一个请求发出到服务器退出用了多久（必须在 --timeout 秒内：不挂住）；
  - 退出后还活着的子进程（必须没有），留下的 IPC socket 文件（必须没有）；
  - 每个流式请求在客户端看到的结局：收到几块，怎样结束（必须是一个错误事件，然后 [DONE]；
    故障之后才到的请求则是 503）。

全部满足时退出码 0，否则 1。

    python benchmark/device_fault.py                         # CPU：tiny-qwen3
    python benchmark/device_fault.py --device cuda --model models/qwen3-0.6b-random
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

from online import Server
from process_cpu import descendants
from report import machine_line, run_to_exit_code

ROOT = Path(__file__).resolve().parent.parent


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def stream(url: str, max_tokens: int, ending: list[str], index: int, errors: set[str]) -> None:
    """One long streamed completion; ending[index] says how it ended for the client, the
    message of its error event goes into `errors`."""
    import httpx

    chunks = 0
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            with http.stream("POST", "/v1/completions", json={
                    "prompt": f"Story number {index}:", "max_tokens": max_tokens,
                    "ignore_eos": True, "stream": True}) as r:
                if r.status_code != 200:
                    ending[index] = f"HTTP {r.status_code}：{r.read().decode()[:160]}"
                    return
                error = ""
                for line in r.iter_lines():
                    if line.startswith("data: [DONE]"):
                        ending[index] = f"{chunks} 块后{error}[DONE]"
                        return
                    if line.startswith('data: {"error"'):
                        errors.add(json.loads(line[6:])["error"]["message"])
                        error = "一个错误事件、"
                    elif line.startswith("data: "):
                        chunks += 1
        ending[index] = f"{chunks} 块后流结束（没有 [DONE]）"
    except Exception as e:  # noqa: BLE001 - how the stream breaks is what we record
        ending[index] = f"{chunks} 块后 {type(e).__name__}"


def served_context(url: str) -> int:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["max_model_len"]


def run(args: argparse.Namespace) -> list[str]:
    """Start the server with the fault armed, stream, wait for its exit; print what happened.
    The failed checks, each a line."""
    argv = [sys.executable, "-m", "minisgl", "--model", args.model, "--port", "0",
            *(["--device", args.device] if args.device else []), *shlex.split(args.server_args)]
    print(f"$ MINISGL_DEBUG_FAULT_STEP={args.step} python {' '.join(map(shlex.quote, argv[1:]))}",
          flush=True)
    started = time.time()
    server = Server(argv, env={"MINISGL_DEBUG_FAULT_STEP": str(args.step)}, keep_lines=None)
    try:
        server.wait_ready(args.startup_timeout)
        children = descendants(server.popen.pid)
        # As long as the context allows: no stream may end before the fault.
        max_tokens = served_context(server.url) - 16
        endings, errors = ["（还没有结束）"] * args.streams, set()
        clients = [threading.Thread(target=stream, daemon=True,
                                    args=(server.url, max_tokens, endings, i, errors))
                   for i in range(args.streams)]
        for client in clients:
            client.start()
        times = wait_exit(server, args.timeout)
        for client in clients:
            client.join(10)
        # Before stop(), which kills whatever of the server's process group is left.
        left = still_running(children, timeout=5.0)
    finally:
        server.stop()
    return report(server, times, (len(children), left), started, (endings, errors), args)


def still_running(pids: list[int], timeout: float) -> list[int]:
    """The pids still running after `timeout` seconds (polled: a helper of the launcher, such
    as its forkserver, exits a moment after it)."""
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def wait_exit(server: Server, timeout: float) -> tuple[float | None, float | None]:
    """Seconds from now until the server says a step failed, and until it exits (None: not
    within `timeout`)."""
    start = time.monotonic()
    failed = exited = None
    while exited is None and time.monotonic() - start < timeout:
        if failed is None and any(" failed (" in line for line in list(server.lines)):
            failed = time.monotonic() - start
        if server.popen.poll() is not None:
            exited = time.monotonic() - start
        time.sleep(0.05)
    return failed, exited


def report(server: Server, times: tuple[float | None, float | None],
           children: tuple[int, list[int]], started: float,
           streams: tuple[list[str], set[str]], args: argparse.Namespace) -> list[str]:
    failed, exited = times
    code = server.popen.returncode if exited is not None else None
    lines = list(server.lines)
    for line in lines:
        if line.startswith("minisgl:"):
            print(f"  {line}")
    print(f"日志 {len(lines)} 行，其中 {sum('Traceback' in x for x in lines)} 个 Traceback")
    count, left = children
    pattern = os.path.join(tempfile.gettempdir(), f"minisgl-{server.popen.pid}-*")
    sockets = [p for p in glob.glob(pattern) if os.stat(p).st_mtime >= started]
    print(f"发出请求后 {failed or math.nan:.1f} 秒日志说那一步失败，{exited or math.nan:.1f} 秒服务器退出，"
          f"退出码 {code}；退出后还在的子进程 {len(left)} 个（共 {count} 个），留下的 "
          f"socket 文件 {len(sockets)} 个")
    endings, errors = streams
    for i, ending in enumerate(endings):
        print(f"  流 {i}：{ending}")
    for error in sorted(errors):
        print(f"错误事件：{error}")
    failures = []
    if code is None:
        failures.append(f"服务器 {args.timeout:.0f} 秒内没有退出")
    elif code == 0:
        failures.append("退出码是 0")
    if not any(" failed (" in x for x in lines if x.startswith("minisgl:")):
        failures.append("没有一行说哪一步失败了")
    # A request that came after the fault had a 503 instead, which is right too.
    if not all(("错误事件" in e and e.endswith("[DONE]")) or e.startswith("HTTP 503")
               for e in endings):
        failures.append("有的流既没有以错误事件和 [DONE] 结束，也不是 503")
    if left or sockets:
        failures.append(f"留下了 {len(left)} 个进程、{len(sockets)} 个 socket 文件")
    return failures


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/tiny-qwen3",
                   help="checkpoint directory; a relative path starts at the repository")
    p.add_argument("--device", default=None, help="the server's (default: its own choice)")
    p.add_argument("--step", type=int, default=40, help="the scheduler step that faults")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds the server has to exit once the requests are sent")
    p.add_argument("--server-args", default="", help="more options for python -m minisgl")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    print(machine_line())
    print(" ".join(["$ python benchmark/device_fault.py", *map(shlex.quote, argv)]), flush=True)
    return run_to_exit_code(lambda: finish(run(args)))


def finish(failures: list[str]) -> int:
    print("结论：" + ("干净地收场" if not failures else "；".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
