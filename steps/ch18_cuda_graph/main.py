"""第 18 章：CUDA Graph。

一、捕获：每个 batch 大小录一张 decode 图（CPU 上是 EmulatedGraph，GPU 上是真的 CUDA graph），
    打印捕获了哪些大小、用了多久；
二、回放与 eager 逐 token 相同：SmolLM2 和 tiny-qwen3，4 个提示词各 16 个 token，开、关重叠调度；
    CPU 上（float32）两者还都等于 transformers；GPU 上（bfloat16）对每个 GPU 注意力后端比较。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.attention import ATTENTION_BACKENDS
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.models import ModelConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
MAX_TOKENS = 16


def generate(path: Path, graph: str, overlap: bool, **options) -> list[list[int]]:
    llm = LLM(str(path), cuda_graph=graph, overlap=overlap, max_running_req=4,
              num_page_override=1024, page_size=16, max_seq_len_override=128, **options)
    try:
        engine = llm.backend.scheduler.engine
        if engine.graphs is not None and overlap:
            print(f"  {path.name}：捕获了 batch {engine.graphs.batch_sizes} 的图，"
                  f"用时 {engine.graph_capture_seconds:.2f} 秒")
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def hf_greedy(path: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outs = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def graph_backends(path: Path, dtype: torch.dtype, cuda: bool) -> list[str]:
    """The attention backends to replay with: on a GPU every GPU backend that runs this model
    (tiny-qwen3's head_dim 32 is not among FlashInfer's), on the CPU the torch backend."""
    if not cuda:
        return ["torch"]
    head_dim = ModelConfig.from_dir(path).head_dim
    return [name for name in ATTENTION_BACKENDS.names() if name != "torch" and
            ATTENTION_BACKENDS.get(name).unsupported_reason(torch.device("cuda"), dtype,
                                                             head_dim) is None]


def main() -> int:
    ok = True
    cuda = torch.cuda.is_available()
    graph = "auto" if cuda else "emulate"
    dtype = torch.bfloat16 if cuda else torch.float32
    print(f"一、{'CUDA graph' if cuda else 'EmulatedGraph（CPU）'}，{str(dtype).removeprefix('torch.')}：")
    runs = []
    for name in ("SmolLM2-135M-Instruct", "tiny-qwen3"):
        path = MODELS / name
        for backend in graph_backends(path, dtype, cuda):
            runs.append((path, backend, {
                overlap: (generate(path, graph, overlap, attention_backend=backend, dtype=dtype),
                          generate(path, "off", overlap, attention_backend=backend, dtype=dtype))
                for overlap in (True, False)}))
    print("\n二、回放对比 eager：")
    for path, backend, results in runs:
        for overlap, (replayed, eager) in results.items():
            same = replayed == eager
            ok &= same
            print(f"  {path.name} --attn {backend}，重叠调度{'开' if overlap else '关'}："
                  f"图回放与 eager 逐 token 相同：{same}")
        if not cuda:
            same = results[True][0] == hf_greedy(path)
            ok &= same
            print(f"  {path.name}：与 transformers 逐 token 相同：{same}")
    print("\n通过" if ok else "\n未通过")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
