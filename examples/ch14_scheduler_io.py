"""第 14 章示例：自己扮演分词进程，和一个调度器进程（world_size=1）收发消息。

送进两个请求，边收边打印每一条 DetokenizeMsg；第一个请求结束后取消第二个，再要一份统计，最后 ExitMsg。
"""

from inspect import signature
from pathlib import Path

import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, DetokenizeMsg, ExitMsg, StatsMsg, StatsReply, UserMsg,
                             decode, encode, unbatch)
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.io import run_scheduler
from minisgl.utils.process import Children
from minisgl.utils.zmq_queue import PullQueue, PushQueue, ipc_address, new_run_id

MODEL = Path("models/SmolLM2-135M-Instruct")


def ids(text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text).input_ids, dtype=torch.int32)


if __name__ == "__main__":  # 子进程（forkserver 起的）会重新 import 本文件：主程序只在这里跑
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    run_id = new_run_id()
    inbox, broadcast, acks, replies = (ipc_address(run_id, n) for n in
                                       ("scheduler", "broadcast", "acks", "detokenizer"))
    config = SchedulerConfig(model_path=str(MODEL), dtype=torch.float32, max_running_req=4,
                             num_page_override=512, max_seq_len_override=256)
    children = Children(run_id)
    # 只有一个 rank（world_size=1）：不建 PUB，也不握手。本章的 run_scheduler 直接收 rank 和
    # world_size；第 16 章把它们挪进 config（tp_rank、tp_size，默认就是单卡），不再单独传
    place = dict(rank=0, world_size=1) if "rank" in signature(run_scheduler).parameters else {}
    process = children.start("minisgl.scheduler.io:run_scheduler", "scheduler", config=config,
                             **place, inbox=inbox, broadcast=broadcast, acks=acks, reply=replies)
    from_scheduler = PullQueue(replies, bind=True, decode=decode)  # 我们就是"反分词进程"
    to_scheduler = PushQueue(inbox, bind=False, encode=encode)
    try:
        print("调度器就绪：", children.wait_ready(timeout=300))
        to_scheduler.put(UserMsg(0, ids("The capital of France is"), SamplingParams(max_tokens=8)))
        to_scheduler.put(UserMsg(1, ids("Tell me a long story."),
                                 SamplingParams(max_tokens=200, ignore_eos=True)))
        aborted = stats = None
        while stats is None:
            received = from_scheduler.get(timeout_ms=60_000)
            if received is None:
                raise TimeoutError("调度器 60 秒没有回复")
            for msg in unbatch(received):
                if isinstance(msg, StatsReply):
                    stats = msg.stats
                    print(f"统计（请求 {msg.uid}）：{stats}")
                    continue
                assert isinstance(msg, DetokenizeMsg)
                text = repr(tokenizer.decode([msg.next_token])) if msg.next_token >= 0 else "—"
                print(f"  uid={msg.uid} token={msg.next_token:>5} {text:<12} "
                      f"finished={msg.finished} {msg.error}")
                if msg.uid == 0 and msg.finished and not aborted:
                    print("请求 0 结束了；取消请求 1，紧接着要一份统计")
                    to_scheduler.put(AbortMsg(1))
                    to_scheduler.put(StatsMsg(99))
                    aborted = True
        back = stats["free_pages"] + stats["cached_pages"] == stats["num_pages"]
        print(f"KV 页全部回来（空闲 {stats['free_pages']} + 缓存 {stats['cached_pages']} == "
              f"总数 {stats['num_pages']}）：{back}")
        to_scheduler.put(ExitMsg())
        process.join(timeout=60)
        print("ExitMsg 之后调度器进程的退出码：", process.exitcode)
    finally:
        children.stop()
        to_scheduler.close()
        from_scheduler.close()
