"""第 16 章：张量并行。

一、切分：按 TP=3 载入 SmolLM2，每个 rank 只读自己那一份权重——没有哪个 rank 拿着整个模型；
二、TP=2（tiny-qwen3）、TP=4（tiny-llama）、TP=3（SmolLM2）：真的进程、gloo 通信，
    输出与 TP=1 逐 token 相同，TP=1 又与 transformers 相同；
三、除不尽的头数在启动前就报错，说清是哪个数、为什么。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.distributed import TPInfo, set_tp_info
from minisgl.llm import LLM
from minisgl.models import load_model

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
MAX_TOKENS = 16
RUNS = [("tiny-qwen3", 2), ("tiny-llama", 4), ("SmolLM2-135M-Instruct", 3)]


def megabytes(model) -> float:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20


def hf_greedy(path: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outs = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def generate(path: Path, tp: int) -> list[list[int]]:
    llm = LLM(str(path), tp_size=tp, max_running_req=4, num_page_override=1024,
              max_seq_len_override=256)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def main() -> int:
    ok = True
    smol = MODELS / "SmolLM2-135M-Instruct"
    print("一、按 TP=3 切分 SmolLM2（在本进程里模拟三个 rank 的载入）：")
    full = megabytes(load_model(smol))
    shards = []
    for rank in range(3):
        set_tp_info(TPInfo(rank, 3))
        model = load_model(smol)
        shards.append(megabytes(model))
        qkv = model.model.layers[0].self_attn.qkv_proj.weight
        embed = model.model.embed_tokens.weight
        print(f"  rank {rank}：{shards[-1]:6.1f} MiB；第 0 层 qkv_proj {tuple(qkv.shape)}，"
              f"embed_tokens {tuple(embed.shape)}")
    set_tp_info(TPInfo())
    ok &= max(shards) < full / 2
    print(f"  完整模型 {full:.1f} MiB；每个 rank 不到一半: {max(shards) < full / 2}")

    print("二、TP=N 与 TP=1（每个请求 16 个 token）：")
    for name, tp in RUNS:
        path = MODELS / name
        one, many = generate(path, 1), generate(path, tp)
        hf = hf_greedy(path)
        same, same_hf = one == many, one == hf
        ok &= same and same_hf
        print(f"  {name:22} TP={tp} 与 TP=1 相同: {same}；TP=1 与 transformers 相同: {same_hf}")
    tokenizer = AutoTokenizer.from_pretrained(smol)
    print(f"  例：{PROMPTS[0]!r} -> {tokenizer.decode(many[0])!r}")

    print("三、头数除不尽：")
    for name, tp in [("SmolLM2-135M-Instruct", 2), ("tiny-qwen3", 8)]:
        try:
            LLM(str(MODELS / name), tp_size=tp)
            ok = False
            print(f"  {name} TP={tp}：没有报错（不应如此）")
        except ValueError as e:
            print(f"  {name} TP={tp}：{e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
