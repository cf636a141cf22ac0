"""第 16 章示例：张量并行。同一个模型、同样的提示词，TP=1 与 TP=2 逐 token 相同；
再在本进程里依次扮演两个 rank 载入模型，看每个 rank 手里的权重是什么形状。

用的是 tiny-qwen3 而不是默认的 SmolLM2：TP=2 要把注意力头平分给两个 rank，SmolLM2 的
9 个 Q 头、3 个 KV 头都是奇数，分不开；tiny-qwen3 是 8 个 Q 头、4 个 KV 头。"""

import time

import torch

from minisgl.core import SamplingParams
from minisgl.distributed import TPInfo, set_tp_info
from minisgl.llm import LLM
from minisgl.models import load_model

MODEL = "models/tiny-qwen3"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def generate(tp_size: int) -> list[dict]:
    start = time.perf_counter()
    llm = LLM(MODEL, dtype=torch.float32, tp_size=tp_size, max_running_req=4,
              num_page_override=512, max_seq_len_override=128)
    try:
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    finally:
        llm.shutdown()  # TP=2：让两个 rank 进程退出
    print(f"TP={tp_size}（含启动 {time.perf_counter() - start:.1f} 秒）")
    for output in outputs:
        print(f"  {output['text']!r}")
    return outputs


def main() -> None:
    one, two = generate(1), generate(2)
    same = [a["token_ids"] for a in one] == [b["token_ids"] for b in two]
    print("TP=2 与 TP=1 的 token 完全相同:", same)
    try:  # 在启动器里就被拒绝，还没起任何 rank 进程
        LLM("models/SmolLM2-135M-Instruct", tp_size=2)
    except ValueError as error:
        print("SmolLM2 开 TP=2 → ValueError:", error)

    print("每个 rank 只载入自己的那一份（在本进程里依次扮演 rank 0、rank 1）：")
    for rank in range(2):
        set_tp_info(TPInfo(rank, 2))
        try:
            model = load_model(MODEL)
        finally:
            set_tp_info(TPInfo())  # 恢复成单卡，免得影响之后在本进程里建的模型
        layer = model.model.layers[0]
        shapes = {
            "qkv_proj": layer.self_attn.qkv_proj.weight.shape,
            "o_proj": layer.self_attn.o_proj.weight.shape,
            "gate_up_proj": layer.mlp.gate_up_proj.weight.shape,
            "down_proj": layer.mlp.down_proj.weight.shape,
            "embed_tokens": model.model.embed_tokens.weight.shape,
            "lm_head": model.lm_head.weight.shape,
        }
        print(f"  rank {rank}: " + "，".join(f"{k} {tuple(v)}" for k, v in shapes.items()))


if __name__ == "__main__":  # 必需：rank 进程用 spawn 启动，会重新导入本文件
    main()
