"""第 18 章示例：decode 用图回放。GPU 上（cuda_graph="auto"）是真的 CUDA graph；CPU 上用
cuda_graph="emulate" 走同一条代码路径，回放由 EmulatedGraph 模拟。两种情况下输出都和 eager 相同。"""

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

MODEL = "models/SmolLM2-135M-Instruct"
graph = "auto" if torch.cuda.is_available() else "emulate"
outputs = {}
for mode in (graph, "off"):
    llm = LLM(MODEL, cuda_graph=mode, max_running_req=3, num_page_override=256,
              max_seq_len_override=128)
    try:
        engine = llm.backend.scheduler.engine
        if engine.graphs is not None:
            print(f"cuda_graph={mode}：捕获了 batch {engine.graphs.batch_sizes}，"
                  f"用时 {engine.graph_capture_seconds:.2f} 秒")
        outs = llm.generate(["The capital of France is", "List three colors:"],
                            SamplingParams(max_tokens=12, ignore_eos=True))
    finally:
        llm.shutdown()
    outputs[mode] = [o["text"] for o in outs]
    for text in outputs[mode]:
        print(f"  {mode:>7} → {text!r}")
print("图回放与 eager 相同：", outputs[graph] == outputs["off"])
