"""第 17 章：GPU 注意力。

一、--attn auto 在这台机器上选了哪个后端；不能在这里运行的后端，启动时就被拒绝，并说明原因；
二、SmolLM2 的四个提示词各生成 16 个 token：CPU 上（float32，torch 后端）与 transformers 逐
    token 相同；有 CUDA 和 flashinfer 时，bfloat16 下每个 GPU 后端与 torch 后端逐 token 比较，
    出现分歧时给出两个候选 token 在 float32 下的 logit 差（差得越小，越说明是舍入决定的）。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.attention import ATTENTION_BACKENDS, resolve_attention_backend
from minisgl.core import SamplingParams
from minisgl.llm import LLM

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
MAX_TOKENS = 16


def generate(path: Path, attn: str, dtype: torch.dtype, device: str) -> list[list[int]]:
    llm = LLM(str(path), dtype=dtype, attention_backend=attn, device=device, max_running_req=4,
              num_page_override=1024, page_size=16, max_seq_len_override=256)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def hf_greedy(hf, tokenizer, device: str) -> list[list[int]]:
    outs = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        out = hf.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def margin(hf, tokenizer, prompt: str, common: list[int], a: int, b: int, device: str) -> float:
    """float32 logit of token a minus that of token b, after prompt + common."""
    ids = tokenizer(prompt).input_ids + common
    with torch.no_grad():
        logits = hf(torch.tensor([ids], device=device)).logits[0, -1]
    return float(logits[a] - logits[b])


def main() -> int:
    ok = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    smol = MODELS / "SmolLM2-135M-Instruct"
    head_dim = 64  # SmolLM2's
    print(f"一、设备 {device}，{str(dtype).removeprefix('torch.')}：")
    auto = resolve_attention_backend("auto", torch.device(device), dtype, head_dim)
    print(f"  --attn auto 选了 {auto}")
    runnable = []
    for name in ATTENTION_BACKENDS.names():
        try:
            resolve_attention_backend(name, torch.device(device), dtype, head_dim)
            runnable.append(name)
            print(f"  --attn {name}：可以运行")
        except ValueError as e:
            print(f"  --attn {name}：启动时拒绝——{e}")
    if auto not in runnable:
        ok = False

    tokenizer = AutoTokenizer.from_pretrained(smol)
    hf = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).to(device)
    print(f"\n二、SmolLM2，{len(PROMPTS)} 个提示词 × {MAX_TOKENS} 个 token：")
    if device == "cpu":
        same = generate(smol, "auto", dtype, device) == hf_greedy(hf, tokenizer, device)
        print(f"  --attn auto（{auto}，float32）与 transformers 逐 token 相同：{same}")
        ok &= same
    else:
        reference = generate(smol, "torch", dtype, device)
        for name in runnable:
            if name == "torch":
                continue
            outs = generate(smol, name, dtype, device)
            agree = sum(x == y for a, b in zip(outs, reference) for x, y in zip(a, b))
            print(f"  --attn {name} 与 torch 后端（都是 bfloat16）：{agree}/"
                  f"{len(PROMPTS) * MAX_TOKENS} 个 token 相同")
            for prompt, a, b in zip(PROMPTS, reference, outs):
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                if first is not None:
                    gap = margin(hf, tokenizer, prompt, a[:first], a[first], b[first], device)
                    print(f"    {prompt!r} 第 {first + 1} 个 token 起分歧：torch 选 {a[first]}，"
                          f"{name} 选 {b[first]}，float32 下两者 logit 差 {gap:.3f}")
    print("\n通过" if ok else "\n未通过")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
