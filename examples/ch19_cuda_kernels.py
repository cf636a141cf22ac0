"""第 19 章示例：模型走我们自己的 CUDA kernel。GPU 上（custom_kernels="auto"）是 nvcc 编出来的
真 kernel；CPU 上用 custom_kernels="emulate"，同一份 .cu 源码由 C++ 编译器编成模拟器来跑。
两种情况下输出都和参考算子（custom_kernels="off"）相同。"""

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

MODEL = "models/tiny-qwen3"  # 有 q/k norm：三个 kernel 都会用到
mode = "auto" if torch.cuda.is_available() else "emulate"
texts = {}
for kernels in (mode, "off"):
    llm = LLM(MODEL, custom_kernels=kernels, max_running_req=2, num_page_override=128,
              max_seq_len_override=64)
    try:
        outs = llm.generate(["The capital of France is", "List three colors:"],
                            SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
    finally:
        llm.shutdown()
    texts[kernels] = [o["text"] for o in outs]
    for text in texts[kernels]:
        print(f"  custom_kernels={kernels:>7} → {text!r}")
print("我们的 kernel 与参考算子输出相同：", texts[mode] == texts["off"])
