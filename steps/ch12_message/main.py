"""第 12 章：消息与 ZMQ。进程之间传的每一种消息都是 dataclass，用 msgpack 编码（张量也一样），
解码回来还是同一个类型、同样的内容。

一、同一进程里：每种消息 encode → decode，类型和内容都不变。
二、跨进程：起一个回声进程，PUSH 过去、它原样 PUSH 回来，逐条比较。
三、广播：rank 0 用 PUB 发给两个 SUB 进程（将来的其他 rank），两边收到的完全相同。
地址带本次运行的 id，几个服务可以在同一台机器上并存。
"""

import subprocess
import sys

import torch

from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, TokenizeMsg, UserMsg,
                             UserReply, decode, encode)
from minisgl.utils.zmq_queue import PubQueue, PullQueue, PushQueue, ipc_address, new_run_id

PARAMS = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=64)
MESSAGES = [
    TokenizeMsg(uid=7, prompt="你好，世界", sampling_params=PARAMS),
    TokenizeMsg(uid=8, prompt=[{"role": "user", "content": "What is 2+2?"}],
                sampling_params=SamplingParams()),
    UserMsg(uid=7, input_ids=torch.tensor([504, 3575, 282, 4649, 314], dtype=torch.int32),
            sampling_params=PARAMS),
    DetokenizeMsg(uid=7, next_token=7042, finished=False),
    UserReply(uid=7, incremental_output=" Paris", finished=True),
    AbortMsg(uid=8),
    BatchMsg([DetokenizeMsg(uid=1, next_token=30, finished=False), AbortMsg(uid=2)]),
]

# 子进程：从一个地址收，原样发到另一个地址，收到 ExitMsg 为止
ECHO = """
import sys
from minisgl.message import ExitMsg, decode, encode
from minisgl.utils.zmq_queue import PullQueue, PushQueue
inbox = PullQueue(sys.argv[1], bind=False, decode=decode)
outbox = PushQueue(sys.argv[2], bind=False, encode=encode)
while not isinstance(message := inbox.get(), ExitMsg):
    outbox.put(message)
outbox.put(message)
"""
# 子进程：订阅广播；先回应探测消息（uid=-1）表示已经订阅上，再收集正式消息直到 ExitMsg
SUBSCRIBER = """
import sys
from minisgl.message import AbortMsg, BatchMsg, ExitMsg, decode, encode
from minisgl.utils.zmq_queue import PushQueue, SubQueue
inbox = SubQueue(sys.argv[1], bind=False, decode=decode)
outbox = PushQueue(sys.argv[2], bind=False, encode=encode)
received, ready = [], False
while not isinstance(message := inbox.get(), ExitMsg):
    if isinstance(message, AbortMsg) and message.uid == -1:
        if not ready:
            outbox.put(message)
            ready = True
    else:
        received.append(message)
outbox.put(BatchMsg(received))
"""


def same(a, b) -> bool:
    return type(a) is type(b) and encode(a) == encode(b)


def main() -> int:
    failed = False
    print("一、同一进程里 encode → decode：")
    for message in MESSAGES:
        raw = encode(message)
        back = decode(raw)
        ok = same(message, back)
        failed |= not ok
        print(f"  {type(message).__name__:14s} {len(raw):4d} 字节  类型与内容不变: {ok}")
    user = decode(encode(MESSAGES[2]))
    print(f"  UserMsg.input_ids 解码后: {user.input_ids.dtype} {user.input_ids.tolist()}")

    run_id = new_run_id()
    to_echo, from_echo = ipc_address(run_id, "to-echo"), ipc_address(run_id, "from-echo")
    outbox = PushQueue(to_echo, bind=True, encode=encode)
    inbox = PullQueue(from_echo, bind=True, decode=decode)
    echo = subprocess.Popen([sys.executable, "-c", ECHO, to_echo, from_echo])
    for message in [*MESSAGES, ExitMsg()]:
        outbox.put(message)
    back = [inbox.get(timeout_ms=30_000) for _ in range(len(MESSAGES) + 1)]
    echo.wait(timeout=30)
    ok = all(same(a, b) for a, b in zip([*MESSAGES, ExitMsg()], back))
    failed |= not ok or echo.returncode != 0
    print(f"二、经回声进程（pid {echo.pid}）往返 {len(back)} 条消息，逐条相同: {ok}")

    broadcast, replies = ipc_address(run_id, "broadcast"), ipc_address(run_id, "replies")
    pub = PubQueue(broadcast, bind=True, encode=encode)
    collect = PullQueue(replies, bind=True, decode=decode)
    subs = [subprocess.Popen([sys.executable, "-c", SUBSCRIBER, broadcast, replies])
            for _ in range(2)]
    ready = 0
    while ready < len(subs):  # PUB 丢弃订阅建立之前发出的消息：先确认两个订阅者都已就绪
        pub.put(AbortMsg(uid=-1))
        ready += collect.get(timeout_ms=100) is not None
    for message in [*MESSAGES, ExitMsg()]:
        pub.put(message)
    results = [collect.get(timeout_ms=30_000) for _ in subs]
    for sub in subs:
        sub.wait(timeout=30)
    ok = all(isinstance(r, BatchMsg) and len(r.messages) == len(MESSAGES)
             and all(same(a, b) for a, b in zip(MESSAGES, r.messages)) for r in results)
    failed |= not ok
    print(f"三、PUB 广播给 {len(subs)} 个订阅进程，各收到 "
          f"{[len(r.messages) for r in results]} 条，内容都与发出的相同: {ok}")
    for queue in (outbox, inbox, pub, collect):
        queue.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
