"""第 14 章：调度器的收发。

起两个调度器进程：rank 0 从"tokenizer"（这里由 main 扮演）收消息，把原始字节转播给 rank 1；
rank 1 是一个完整的副本（第 16 章它才只拿一半权重），也把结果发回来给我们对照。
一、四个请求经 ZMQ 送进 rank 0，收回的 token 与 transformers 逐个相同；
二、rank 1 收到同样的消息、做出同样的决定，吐出的 token 与 rank 0 完全相同；
三、中途取消一个请求：它的页表行和 KV 页全部回来（free + 可淘汰的缓存 == 总页数）；
四、超出上下文的请求得到错误回复，调度器接着服务下一个请求；
五、ExitMsg 让两个进程都正常退出。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, DetokenizeMsg, ExitMsg, StatsMsg, StatsReply, UserMsg,
                             decode, encode, unbatch)
from minisgl.scheduler import SchedulerConfig
from minisgl.utils.process import Children
from minisgl.utils.zmq_queue import PullQueue, PushQueue, ipc_address, new_run_id

MODEL = Path("models/SmolLM2-135M-Instruct")  # from the repository root or a built tree
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
MAX_TOKENS = 16


def hf_greedy(tokenizer, prompts: list[str]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    outs = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


class Collector:
    """Tokens per uid as they come back from one rank."""

    def __init__(self, address: str) -> None:
        self.queue = PullQueue(address, bind=True, decode=decode)
        self.tokens: dict[int, list[int]] = {}
        self.ended: dict[int, DetokenizeMsg] = {}
        self.stats: list[StatsReply] = []

    def pump(self, until, timeout_ms: int = 60_000) -> None:
        while not until():
            raw = self.queue.get(timeout_ms=timeout_ms)
            if raw is None:
                raise TimeoutError("no reply from the scheduler")
            for msg in unbatch(raw):
                if isinstance(msg, StatsReply):
                    self.stats.append(msg)
                    continue
                if msg.next_token >= 0:
                    self.tokens.setdefault(msg.uid, []).append(msg.next_token)
                if msg.finished:
                    self.ended[msg.uid] = msg


def main() -> int:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    run_id = new_run_id()
    inbox, broadcast, acks, out0, out1 = (ipc_address(run_id, n) for n in (
        "scheduler", "broadcast", "acks", "detokenizer", "rank1-results"))
    ranks, ok = [Collector(out0), Collector(out1)], True
    config = SchedulerConfig(model_path=str(MODEL), dtype=torch.float32, max_running_req=4,
                             num_page_override=512, max_seq_len_override=256)
    children = Children(run_id)
    for rank, out in enumerate((out0, out1)):
        children.start("minisgl.scheduler.io:run_scheduler", f"scheduler-rank{rank}",
                       config=config, rank=rank, world_size=2, inbox=inbox, broadcast=broadcast,
                       acks=acks, reply=out)
    to_scheduler = PushQueue(inbox, bind=False, encode=encode)
    try:
        infos = children.wait_ready(timeout=300)
        print(f"两个调度器进程就绪（pid {[p.pid for p in children.processes]}）：{infos}")

        params = SamplingParams(max_tokens=MAX_TOKENS)
        for uid, prompt in enumerate(PROMPTS):
            ids = torch.tensor(tokenizer(prompt).input_ids, dtype=torch.int32)
            to_scheduler.put(UserMsg(uid, ids, params))
        for r in ranks:
            r.pump(lambda r=r: all(u in r.ended for u in range(len(PROMPTS))))
        expected = hf_greedy(tokenizer, PROMPTS)
        print("一、四个请求（贪心，各 16 个 token）：")
        for uid, prompt in enumerate(PROMPTS):
            same = ranks[0].tokens[uid] == expected[uid]
            ok &= same
            print(f"  {prompt!r} -> {tokenizer.decode(ranks[0].tokens[uid])!r}  "
                  f"与 transformers 相同: {same}")
        same = ranks[1].tokens == ranks[0].tokens
        ok &= same
        print(f"二、rank 1 的 token 与 rank 0 完全相同: {same}")

        long = torch.tensor(tokenizer("Tell me a long story.").input_ids, dtype=torch.int32)
        to_scheduler.put(UserMsg(10, long, SamplingParams(max_tokens=200, ignore_eos=True)))
        for r in ranks:
            r.pump(lambda r=r: len(r.tokens.get(10, [])) >= 3 or 10 in r.ended)
        to_scheduler.put(AbortMsg(10))
        to_scheduler.put(StatsMsg(11))
        for r in ranks:
            r.pump(lambda r=r: 10 in r.ended and r.stats)
        stats = ranks[0].stats[-1].stats
        returned = stats["free_pages"] + stats["cached_pages"] == stats["num_pages"]
        idle = stats["locked_pages"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
        aborted = ranks[0].ended[10].error == "aborted" and len(ranks[0].tokens[10]) < 200
        ok &= aborted
        ok &= returned and idle and aborted and ranks[1].stats[-1].stats == stats
        print(f"三、请求 10 生成 {len(ranks[0].tokens[10])} 个 token 后取消；之后的统计：{stats}")
        print(f"    KV 页全部回来（空闲 + 缓存 == 总数）: {returned}，没有锁住的页、没有请求: {idle}，"
              f"两个 rank 统计相同: {ranks[1].stats[-1].stats == stats}")

        too_long = torch.zeros(300, dtype=torch.int32)
        to_scheduler.put(UserMsg(20, too_long, SamplingParams(max_tokens=8)))
        to_scheduler.put(UserMsg(21, torch.tensor(tokenizer(PROMPTS[0]).input_ids,
                                                  dtype=torch.int32), params))
        for r in ranks:
            r.pump(lambda r=r: 20 in r.ended and 21 in r.ended)
        refused = ranks[0].ended[20].error
        served = ranks[0].tokens[21] == expected[0]
        ok &= bool(refused) and served
        print(f"四、300 个 token 的 prompt 被拒绝：{refused!r}；下一个请求照常完成且正确: {served}")

        to_scheduler.put(ExitMsg())
        for p in children.processes:
            p.join(timeout=60)
        codes = [p.exitcode for p in children.processes]
        ok &= codes == [0, 0]
        print(f"五、ExitMsg 之后两个进程的退出码：{codes}")
    finally:
        children.stop()
        to_scheduler.close()
        for r in ranks:
            r.queue.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
