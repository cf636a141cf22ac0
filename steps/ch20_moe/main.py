"""第 20 章：MoE。

一、tiny-qwen3-moe 的结构：几个专家、每个 token 选几个、哪些层是稀疏的（与 transformers 的规则相同）；
二、torch 参考后端：逐 token 与 transformers 相同（CPU 上 float32）；
三、Triton 融合后端：一层 MoE 的输出与参考后端的差；整个模型的 token 与 transformers 相同。
    CPU 上 Triton 的 kernel 只能在它的解释器里跑（TRITON_INTERPRET=1，在 kernel 模块导入之前设好），
    慢，但执行的是 kernel 自己的代码；GPU 上是真的 kernel（bfloat16，与参考后端比较）。
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before any Triton kernel is decorated: see moe/triton_backend.py
    os.environ["TRITON_INTERPRET"] = "1"

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.models import ModelConfig  # noqa: E402
from minisgl.moe import TorchMoEBackend, TritonMoEBackend  # noqa: E402

MODEL = Path("models/tiny-qwen3-moe")  # run from the repository root, or a tree built by tools/steps.py
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 8


def generate(backend: str, dtype: torch.dtype) -> list[list[int]]:
    llm = LLM(str(MODEL), dtype=dtype, moe_backend=backend, max_running_req=2,
              num_page_override=128, max_seq_len_override=64)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
                            progress=False)
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def hf_greedy() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    outs = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def one_layer_difference(config: ModelConfig, device: str, dtype: torch.dtype) -> float:
    """The fused kernel against the reference loop on one random MoE layer of this shape."""
    gen = torch.Generator().manual_seed(0)
    experts, inter, hidden = config.num_experts, config.moe_intermediate_size, config.hidden_size
    x = torch.randn(37, hidden, generator=gen).to(device, dtype)
    logits = torch.randn(37, experts, generator=gen).to(device)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(device, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5).to(device, dtype)
    args = (x, logits, w13, w2, config.num_experts_per_tok, config.norm_topk_prob)
    fused, reference = TritonMoEBackend().forward(*args), TorchMoEBackend().forward(*args)
    return (fused.float() - reference.float()).abs().max().item()


def main() -> int:
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    config = ModelConfig.from_dir(MODEL)
    sparse = [i for i in range(config.num_layers) if config.is_moe_layer(i)]
    print(f"一、{MODEL.name}：{config.num_layers} 层，第 {sparse} 层是 MoE（其余是普通 MLP），"
          f"每层 {config.num_experts} 个专家、每个 token 选 {config.num_experts_per_tok} 个，"
          f"专家的中间维度 {config.moe_intermediate_size}")
    expected = generate("torch", dtype) if cuda else hf_greedy()
    ok = True
    if cuda:
        print("\n二、--moe torch（GPU，bfloat16）：作为下面的参考")
    else:
        same = generate("torch", dtype) == expected
        print(f"\n二、--moe torch（float32）：与 transformers 逐 token 相同：{same}")
        ok &= same
    where = "GPU，bfloat16" if cuda else "CPU 上的 Triton 解释器，float32"
    difference = one_layer_difference(config, "cuda" if cuda else "cpu", dtype)
    tolerance = 3e-2 if cuda else 1e-5
    print(f"\n三、--moe triton（{where}）：\n  一层 MoE（37 个 token）与参考后端的最大差 "
          f"{difference:.2e}（容差 {tolerance:g}）")
    ok &= difference <= tolerance
    same = generate("triton", dtype) == expected
    reference = "torch 后端" if cuda else "transformers"
    print(f"  整个模型：与 {reference} 逐 token 相同：{same}")
    ok &= same
    print("\n通过" if ok else "\n未通过")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
