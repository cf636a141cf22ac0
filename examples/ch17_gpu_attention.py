"""第 17 章示例：选注意力后端。--attn auto（LLM 的 attention_backend="auto"）挑这台机器上能跑的
最快的一个：CPU 上是 torch，有 CUDA 和 flashinfer 的 GPU 上是 flashinfer。点名一个这里跑不了的
后端，启动时就报错，说清原因和替代。"""

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

MODEL = "models/SmolLM2-135M-Instruct"
dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32

llm = LLM(MODEL, dtype=dtype, attention_backend="auto", max_running_req=2,
          num_page_override=256, page_size=16, max_seq_len_override=128)
try:
    print("auto 选了：", llm.backend.scheduler.engine.attention_backend_name)
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=12, ignore_eos=True))
    print(f"  → {out[0]['text']!r}")
finally:
    llm.shutdown()

for name in ("flashinfer", "fa"):
    try:
        LLM(MODEL, dtype=dtype, attention_backend=name).shutdown()
        print(f"--attn {name}：可以运行")
    except ValueError as e:
        print(f"--attn {name}：{e}")
