"""第 12 章示例：看看一条消息在线上长什么样，以及 PUSH/PULL 怎样把它送到另一端。"""

import msgpack
import torch

from minisgl.core import SamplingParams
from minisgl.message import BatchMsg, DetokenizeMsg, UserMsg, decode, encode
from minisgl.utils.zmq_queue import PullQueue, PushQueue, ipc_address, new_run_id

message = UserMsg(uid=3, input_ids=torch.tensor([504, 3575, 282], dtype=torch.int32),
                  sampling_params=SamplingParams(max_tokens=8))
raw = encode(message)
print(f"{len(raw)} 字节；msgpack 解开后是：")
print(msgpack.unpackb(raw))
print("decode 回来：", decode(raw))

address = ipc_address(new_run_id(), "demo")
receiver = PullQueue(address, bind=True, decode=decode)
sender = PushQueue(address, bind=False, encode=encode)
sender.put(BatchMsg([DetokenizeMsg(uid=3, next_token=7042, finished=False),
                     DetokenizeMsg(uid=3, next_token=30, finished=True)]))
print(f"经 {address} 收到：", receiver.get(timeout_ms=5_000))
print("再等 100 毫秒没有新消息：", receiver.get(timeout_ms=100))
sender.close()
receiver.close()
