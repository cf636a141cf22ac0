"""第 11 章示例：LLM.generate 的几种用法——字符串或 token id、统一或逐个的采样参数，重叠调度开关。"""

import time

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

for overlap in [True, False]:
    llm = LLM("models/SmolLM2-135M-Instruct", dtype=torch.float32, max_running_req=8,
              num_page_override=1024, max_seq_len_override=256, overlap=overlap)
    start = time.perf_counter()
    outputs = llm.generate(
        ["The capital of France is", [504, 3575, 282, 8295, 314]],  # 字符串或 token id 都行
        [SamplingParams(max_tokens=10), SamplingParams(max_tokens=10, temperature=0.7, top_k=20)])
    print(f"overlap={overlap}（{time.perf_counter() - start:.2f} 秒）")
    for output in outputs:
        print(f"  {output['text']!r} {output['token_ids']}")
    try:
        llm.generate(["x" * 3000], SamplingParams(max_tokens=8))
    except ValueError as error:
        print("  过长的提示词 → ValueError:", error)
    llm.shutdown()
