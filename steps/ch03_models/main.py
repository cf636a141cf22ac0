"""第 3 章：模型与权重加载。按 config.json 里的 architectures 从注册表建模型，从 safetensors
读权重（q/k/v、gate/up 在加载时拼接，共享的 lm_head 不占权重），logits 与 HF 对齐，16 个
token 逐个一致：Llama、Qwen3，以及 q/k/v 带偏置的 Qwen2 和 Mistral。不支持的配置（比上下文
短的滑动窗口）在加载时就被拒绝。注意力暂时还是第 1 章 main 里那个连续 KV cache。
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Context, Phase, Req, SamplingParams, get_global_ctx, set_global_ctx
from minisgl.models import CausalLM, ModelConfig, load_model

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPT, MAX_TOKENS = "The capital of France is", 16


@dataclass
class LastTokens:  # 满足 core.AttentionMetadata
    last_indices: torch.Tensor


class ContiguousAttention:
    """和第 1 章 main 里的一样：连续 KV cache，每个请求槽位一行。第 4、5 章会换掉它。"""

    def __init__(self, n_layers: int, n_slots: int, max_len: int, n_kv: int, head_dim: int):
        self.k = torch.zeros(n_layers, n_slots, max_len, n_kv, head_dim)
        self.v = torch.zeros_like(self.k)

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        outputs, start = [], 0
        for req in batch.reqs:
            n, row = req.extend_len, req.table_idx
            self.k[layer_id, row, req.cached_len : req.device_len] = k[start : start + n]
            self.v[layer_id, row, req.cached_len : req.device_len] = v[start : start + n]
            keys = self.k[layer_id, row, : req.device_len].transpose(0, 1)
            values = self.v[layer_id, row, : req.device_len].transpose(0, 1)
            mask = torch.ones(n, req.device_len, dtype=torch.bool).tril(req.cached_len)
            out = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1), keys,
                                                 values, attn_mask=mask, enable_gqa=True)
            outputs.append(out.transpose(0, 1))
            start += n
        return torch.cat(outputs)


def make_batch(reqs: list[Req], phase: Phase) -> Batch:
    batch = Batch(reqs, phase)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).long()
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.attn_metadata = LastTokens(torch.tensor([r.extend_len for r in reqs]).cumsum(0) - 1)
    return batch


def generate(model: CausalLM, req: Req) -> tuple[list[int], torch.Tensor]:
    """贪心生成；顺便返回 prefill 那一步的 logits，用来和 HF 直接比较。"""
    ctx, phase, first_logits = get_global_ctx(), "prefill", None
    while req.can_decode:
        batch = make_batch([req], phase)  # type: ignore[arg-type]
        with ctx.forward_batch(batch):
            logits = model.forward()
        first_logits = logits[0] if first_logits is None else first_logits
        req.complete_one()
        req.append_host(int(logits[0].argmax()))
        phase = "decode"
    return req.output_ids, first_logits


def main() -> int:
    torch.set_grad_enabled(False)
    failed = False
    for name in ["SmolLM2-135M-Instruct", "tiny-qwen3", "tiny-llama", "tiny-qwen2",
                 "tiny-mistral"]:
        path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
        model = load_model(path, dtype=torch.float32)
        c = model.config
        print(f"[{name}] {c.architecture}：{c.num_layers} 层，{c.num_q_heads}/{c.num_kv_heads} 头，"
              f"共享 embedding={c.tie_word_embeddings}，RoPE 缩放={(c.rope_scaling or {}).get('rope_type')}，"
              f"q/k/v 偏置={c.attention_bias}，"
              f"参数 {sum(t.numel() for t in model.state_dict().values()) / 1e6:.1f}M 个")
        set_global_ctx(Context(attn_backend=ContiguousAttention(
            c.num_layers, n_slots=1, max_len=64, n_kv=c.num_kv_heads, head_dim=c.head_dim)))
        prompt_ids = tokenizer(PROMPT).input_ids
        req = Req(torch.tensor(prompt_ids, dtype=torch.int32), table_idx=0, cached_len=0,
                  output_len=MAX_TOKENS, uid=0, sampling_params=SamplingParams(max_tokens=16))
        ours, logits = generate(model, req)

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        ids = torch.tensor([prompt_ids])
        hf_logits = hf(ids).logits[0, -1]
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                             eos_token_id=None, do_sample=False)[0, len(prompt_ids) :].tolist()
        diff = (logits - hf_logits).abs().max().item()
        same = sum(a == b for a, b in zip(ours, theirs))
        print(f"  prefill logits 与 HF 的最大误差 {diff:.2e}（logits 的量级 {hf_logits.abs().max():.1f}）")
        print(f"  {PROMPT!r} → {tokenizer.decode(ours)!r}")
        print(f"  与 HF 逐 token 一致: {same}/{MAX_TOKENS}" + ("" if ours == theirs else "  ← 不一致！"))
        failed |= ours != theirs or diff > 1e-3

    # 滑动窗口注意力没有实现：窗口比要服务的上下文短时，加载就失败，而不是悄悄算错。
    mistral_v01 = {**json.loads((MODELS / "tiny-mistral" / "config.json").read_text()),
                   "sliding_window": 4096, "max_position_embeddings": 32768}
    try:
        ModelConfig.from_hf(mistral_v01)
        print("滑动窗口 4096 < 上下文 32768 的 Mistral 竟然被接受了  ← 不应该！")
        failed = True
    except ValueError as e:
        print(f"[Mistral v0.1 式的配置] ValueError: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
