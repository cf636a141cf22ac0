"""第 20 章示例：MoE 模型用两种后端生成。torch 后端逐个专家循环；triton 后端是融合 kernel——GPU 上
编译运行，CPU 上在 Triton 的解释器里运行（TRITON_INTERPRET=1 要在 kernel 模块导入之前设好）。"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

texts = {}
for backend in ("torch", "triton"):
    llm = LLM("models/tiny-qwen3-moe", moe_backend=backend, max_running_req=2,
              num_page_override=128, max_seq_len_override=64)
    try:
        outs = llm.generate(["The capital of France is", "List three colors:"],
                            SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    finally:
        llm.shutdown()
    texts[backend] = [o["text"] for o in outs]
    for text in texts[backend]:
        print(f"  --moe {backend:>6} → {text!r}")
print("两种后端输出相同：", texts["torch"] == texts["triton"])
