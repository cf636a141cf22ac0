"""导读：用离线接口跑几个请求，看看最终要做出来的东西长什么样。

在仓库根目录运行：python examples/ch00_quickstart.py（先 make check 或 make test 准备好模型）
"""

import time

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

llm = LLM("models/SmolLM2-135M-Instruct", dtype=torch.float32, max_running_req=8,
          num_page_override=2048, max_seq_len_override=512)
prompts = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):"]
start = time.perf_counter()
outputs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
elapsed = time.perf_counter() - start
for prompt, output in zip(prompts, outputs):
    print(f"{prompt!r} -> {output['text']!r}")
print(f"3 个请求 × 16 个 token，CPU 上用时 {elapsed:.2f} 秒")
llm.shutdown()
