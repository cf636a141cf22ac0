"""第 21 章：基准测试。

一、阶段四的里程碑（CPU，float32，4 个提示词各 16 个 token）：TP=N 的多进程（gloo）加上 decode 图回放
    （EmulatedGraph，cuda_graph="emulate"）与 TP=1 的 eager（cuda_graph="off"）逐 token 相同，
    TP=1 又与 transformers 相同。tiny-qwen3 用 TP=2；SmolLM2 的 9 个头分不成两份，用 TP=3。
二、屋顶线的算术：Qwen3-0.6B 的形状（bfloat16）。参数量先与 transformers 的模型对上，再算
    上下文 1,024 个 token 时一步 decode 在 batch 1 和 256 下必须搬运的字节和浮点运算，以及在 H200 上
    各自的时间下界（带宽 vs 算力）。两种 batch 都受限于访存：batch 256 时大头是 KV cache 而不是权重。
    H200 上的实测（benchmark/roofline.py）记在本章的书页里。
"""

import sys
import unicodedata
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from minisgl.benchmark.roofline import H200, ModelShape, StepShape, step_cost
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.models import ModelConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
MAX_TOKENS = 16
RUNS = [("tiny-qwen3", 2), ("SmolLM2-135M-Instruct", 3)]
# Qwen3-0.6B's config.json (as tools/models.py builds qwen3-0.6b-random): no checkpoint needed.
QWEN3_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6)
CONTEXT = 1024
HEADER = ["batch", "权重 GB", "KV GB", "GFLOP", "访存 μs", "算力 μs", "下界 μs", "每 token μs", "受限于"]
WIDTHS = [5, 10, 9, 8, 10, 10, 10, 13, 8]


def right(text: str, width: int) -> str:
    """Right-aligned by display width: a CJK character takes two columns."""
    wide = sum(unicodedata.east_asian_width(c) in "WF" for c in text)
    return " " * (width - len(text) - wide) + text


def hf_greedy(path: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outs = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def generate(path: Path, tp: int, graph: str) -> list[list[int]]:
    llm = LLM(str(path), tp_size=tp, cuda_graph=graph, max_running_req=4, num_page_override=512,
              max_seq_len_override=128)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
                            progress=False)
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def milestone() -> bool:
    ok = True
    print("一、阶段四的里程碑：")
    for name, tp in RUNS:
        path = MODELS / name
        eager = generate(path, 1, "off")
        replayed = generate(path, tp, "emulate")
        same, same_hf = replayed == eager, eager == hf_greedy(path)
        ok &= same and same_hf
        print(f"  {name:22} TP={tp} + 图回放 与 TP=1 eager 相同：{same}；"
              f"TP=1 与 transformers 相同：{same_hf}")
    return ok


def roofline() -> bool:
    hf = Qwen3Config(**QWEN3_0_6B)
    with torch.device("meta"):  # shapes only: no memory, no time
        counted = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf).parameters())
    shape = ModelShape.of(ModelConfig.from_hf({**hf.to_dict(),
                                               "architectures": ["Qwen3ForCausalLM"]}))
    ok = shape.parameters == counted
    print(f"\n二、Qwen3-0.6B 的形状，bfloat16，每个请求已有 {CONTEXT:,} 个 token，H200"
          f"（{H200.bandwidth / 1e12:.1f} TB/s，{H200.peak_flops / 1e12:.0f} TFLOP/s）：")
    print(f"  参数 {shape.parameters:,}（transformers 数出 {counted:,}，相同：{ok}）；"
          f"每个 token 的 KV {shape.kv_per_token * 2 / 1e3:.1f} KB")
    print("  " + "".join(right(h, w) for h, w in zip(HEADER, WIDTHS)))
    kv_over_weights = False
    for batch in (1, 256):
        cost = step_cost(shape, StepShape.of("decode", [(CONTEXT, CONTEXT + 1)] * batch), 2)
        memory_bound = cost.memory_bound(H200)
        ok &= memory_bound
        kv_over_weights = cost.kv_bytes > cost.weight_bytes
        cells = [f"{batch}", f"{cost.weight_bytes / 1e9:.3f}", f"{cost.kv_bytes / 1e9:.3f}",
                 f"{cost.flops / 1e9:.1f}", f"{cost.memory_seconds(H200) * 1e6:.1f}",
                 f"{cost.compute_seconds(H200) * 1e6:.1f}", f"{cost.bound(H200) * 1e6:.1f}",
                 f"{cost.bound(H200) * 1e6 / batch:.2f}", "访存" if memory_bound else "算力"]
        print("  " + "".join(right(c, w) for c, w in zip(cells, WIDTHS)))
    ok &= kv_over_weights
    print(f"  batch 256 时 KV 的字节多于权重：{kv_over_weights}")
    return ok


def main() -> int:
    ok = milestone()
    ok &= roofline()
    print("\n通过" if ok else "\n未通过")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
