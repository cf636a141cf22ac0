"""第 15 章：API Server —— 阶段三的里程碑。

用 `python -m minisgl` 在 SmolLM2 上起服务（真的进程、真的 HTTP），然后：
一、用官方 openai 客户端流式地做一次 chat completion，拼出的文字等于 transformers 的贪心结果；
二、8 个客户端同时请求，每个拿到的与它单独请求时完全相同（文字和 token 数）；
三、流式读到一半断开连接：请求被取消，KV 页全部回来；
四、错误的请求得到 OpenAI 格式的 4xx，服务照常工作；
五、SIGTERM（Ctrl-C 同理）之后服务和所有子进程都退出。
"""

import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL = Path("models/SmolLM2-135M-Instruct")  # from the repository root or a built tree
QUESTIONS = ["What is the capital of France?", "Name three primary colors.",
             "Write a haiku about the sea.", "What is 12 times 12?", "Say hello in Spanish.",
             "What do bees make?", "Give me a word that rhymes with cat.",
             "How many days are in a week?"]
MAX_TOKENS = 24


def start_server() -> tuple[subprocess.Popen, str]:
    """The server on any free port (--port 0), and its base URL from the ready line."""
    server = subprocess.Popen(
        [sys.executable, "-m", "minisgl", "--model", str(MODEL), "--port", "0",
         "--max-running-req", "8", "--max-seq-len", "1024", "--dtype", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:  # "minisgl: ready, serving ... at http://HOST:PORT/v1 ..."
        print(f"  [server] {line.rstrip()}")
        if ready := re.search(r"minisgl: ready, .* at (http://\S+)/v1 ", line):
            return server, ready.group(1)
    raise RuntimeError(f"the server exited with code {server.wait()} before it was ready")


def descendants_of(pid: int) -> list[int]:
    """Children, theirs, and so on: the workers are children of the server's forkserver."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return children + [d for child in children for d in descendants_of(child)]


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child whose parent has not collected it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def hf_chat_greedy(question: str) -> str:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def ask(client: openai.OpenAI, question: str) -> tuple[str, int]:
    r = client.chat.completions.create(model="SmolLM2", temperature=0, max_tokens=MAX_TOKENS,
                                       messages=[{"role": "user", "content": question}])
    return r.choices[0].message.content, r.usage.completion_tokens


def main() -> int:
    print("启动 python -m minisgl（--port 0：系统挑一个空闲端口）：")
    server, base = start_server()
    children = descendants_of(server.pid)
    ok = True
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
        print(f"  服务进程 {server.pid}，子孙进程 {children}")

        print("一、openai 客户端，流式：")
        stream = client.chat.completions.create(
            model="SmolLM2", temperature=0, max_tokens=MAX_TOKENS, stream=True,
            messages=[{"role": "user", "content": QUESTIONS[0]}])
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        print(f"  {len(pieces)} 个片段：{pieces}")
        expected = hf_chat_greedy(QUESTIONS[0])
        same = "".join(pieces) == expected
        ok &= same
        print(f"  拼起来：{''.join(pieces)!r}\n  与 transformers 贪心结果相同: {same}")

        print("二、8 个客户端并发：")
        alone = [ask(client, q) for q in QUESTIONS]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda q: ask(client, q), QUESTIONS))
        for q, a, t in zip(QUESTIONS, alone, together):
            ok &= a == t
            print(f"  {q!r:45} {t[1]:2d} 个 token  与单独请求相同: {a == t}")

        print("三、流式读 5 个片段后断开：")
        with httpx.Client(base_url=base, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json={
                    "prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True,
                    "stream": True}) as response:
                lines = [line for _, line in zip(range(10), response.iter_lines()) if line]
            print(f"  收到 {len(lines)} 个事件后关闭连接")
            for _ in range(50):  # the abort travels API server -> tokenizer -> scheduler
                stats = http.get("/stats").json()
                if stats["running"] == 0:
                    break
                time.sleep(0.1)
            back = (stats["free_pages"] + stats["cached_pages"] == stats["num_pages"]
                    and stats["locked_pages"] == 0 and stats["running"] == 0)
            ok &= back
            print(f"  之后的统计：{stats}\n  KV 页全部回来: {back}")

            print("四、错误的请求：")
            bad = [("不是 JSON", b"{oops"), ("max_tokens 为负", {"prompt": "x", "max_tokens": -1}),
                   ("temperature < 0", {"prompt": "x", "temperature": -1}),
                   ("top_p > 1", {"prompt": "x", "top_p": 1.5}),
                   ("prompt 超出上下文", {"prompt": "hi " * 2000, "max_tokens": 8})]
            for label, body in bad:
                r = (http.post("/v1/completions", content=body,
                               headers={"content-type": "application/json"})
                     if isinstance(body, bytes) else http.post("/v1/completions", json=body))
                ok &= r.status_code == 400 and "message" in r.json()["error"]
                print(f"  {label:14} -> {r.status_code} {r.json()['error']['message']!r}")
            after = ask(client, QUESTIONS[0])
            ok &= after == alone[0]
            print(f"  之后的正常请求结果不变: {after == alone[0]}")
    finally:
        print("五、发送 SIGTERM：")
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        rest = server.stdout.read().strip()
        if rest:
            print("\n".join(f"  [server] {line}" for line in rest.splitlines()))
    time.sleep(1)
    alive = [pid for pid in children if running(pid)]
    ok &= code == 0 and not alive
    print(f"  退出码 {code}；仍在运行的子孙进程：{alive}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
