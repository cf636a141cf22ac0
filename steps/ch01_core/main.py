"""第 1 章：用 Req / Batch / Context 驱动第 0 步的前向，输出仍与 Hugging Face 逐 token 一致。

模型代码还是第 0 步手写的那一份，变化在于它不再接收参数：当前 batch 的 token、位置放在全局
Context 里，注意力通过 Context 上的 attn_backend 完成。KV cache 仍是连续的，按请求的槽位
（table_idx）分行存放。
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Context, Phase, Req, SamplingParams, get_global_ctx, set_global_ctx

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPT, MAX_TOKENS = "The capital of France is", 16


@dataclass
class LastTokens:  # 满足 core.AttentionMetadata：每个请求最后一个 token 在 batch 中的下标
    last_indices: torch.Tensor


class ContiguousAttention:
    """满足 core.AttentionBackend 的最简实现：第 0 步的连续 KV cache，每个请求槽位一行。"""

    def __init__(self, n_layers: int, n_slots: int, max_len: int, n_kv: int, head_dim: int):
        self.k = torch.zeros(n_layers, n_slots, max_len, n_kv, head_dim)
        self.v = torch.zeros_like(self.k)

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        outputs, start = [], 0
        for req in batch.reqs:  # 一个 batch 里的请求长度各不相同（ragged），逐个处理
            n, row = req.extend_len, req.table_idx
            self.k[layer_id, row, req.cached_len : req.device_len] = k[start : start + n]
            self.v[layer_id, row, req.cached_len : req.device_len] = v[start : start + n]
            keys = self.k[layer_id, row, : req.device_len].transpose(0, 1)
            values = self.v[layer_id, row, : req.device_len].transpose(0, 1)
            # 新 token 排在已缓存的 cached_len 个 token 之后，因果掩码要错开这一段
            mask = torch.ones(n, req.device_len, dtype=torch.bool).tril(req.cached_len)
            out = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1), keys,
                                                 values, attn_mask=mask, enable_gqa=True)
            outputs.append(out.transpose(0, 1))
            start += n
        return torch.cat(outputs)


class Step0Model:
    """第 0 步的前向，只是输入改从全局 Context 读取。"""

    def __init__(self, path: Path):
        cfg = json.loads((path / "config.json").read_text())
        self.w = load_file(path / "model.safetensors")
        self.n_layers, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.n_heads, self.n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.n_heads
        theta = cfg.get("rope_parameters", cfg).get("rope_theta", 10000.0)
        inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(torch.arange(4096).float(), inv_freq)
        self.cos, self.sin = angles.cos(), angles.sin()
        tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w
        self.lm_head = self.w["model.embed_tokens.weight" if tied else "lm_head.weight"]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def attention(self, i: int, x: torch.Tensor) -> torch.Tensor:
        ctx, p, n = get_global_ctx(), f"model.layers.{i}.self_attn.", x.shape[0]
        q = (x @ self.w[p + "q_proj.weight"].T).view(n, self.n_heads, self.head_dim)
        k = (x @ self.w[p + "k_proj.weight"].T).view(n, self.n_kv, self.head_dim)
        v = (x @ self.w[p + "v_proj.weight"].T).view(n, self.n_kv, self.head_dim)
        if p + "q_norm.weight" in self.w:
            q = self.rms_norm(q, self.w[p + "q_norm.weight"])
            k = self.rms_norm(k, self.w[p + "k_norm.weight"])
        q, k = self.rope(q, ctx.batch.positions), self.rope(k, ctx.batch.positions)
        out = ctx.attn_backend.forward(q, k, v, i, ctx.batch)
        return out.reshape(n, -1) @ self.w[p + "o_proj.weight"].T

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{i}.mlp."
        gate, up = x @ self.w[p + "gate_proj.weight"].T, x @ self.w[p + "up_proj.weight"].T
        return (F.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    @torch.no_grad()
    def forward(self) -> torch.Tensor:  # 没有参数：输入全在 get_global_ctx().batch 里
        batch = get_global_ctx().batch
        x = self.w["model.embed_tokens.weight"][batch.input_ids]
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            x = x + self.attention(i, self.rms_norm(x, self.w[p + "input_layernorm.weight"]))
            x = x + self.mlp(i, self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"]))
        x = x[batch.attn_metadata.last_indices]  # 每个请求只需要最后一个位置的 logits
        return self.rms_norm(x, self.w["model.norm.weight"]) @ self.lm_head.T


def make_batch(reqs: list[Req], phase: Phase) -> Batch:
    """把每个请求 [cached_len, device_len) 这一段待算的 token 拼成一个 batch。"""
    batch = Batch(reqs, phase)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).long()
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.attn_metadata = LastTokens(torch.tensor([r.extend_len for r in reqs]).cumsum(0) - 1)
    return batch


def generate(model: Step0Model, req: Req) -> list[int]:
    ctx = get_global_ctx()
    phase: Phase = "prefill"
    while req.can_decode:
        batch = make_batch([req], phase)
        with ctx.forward_batch(batch):
            logits = model.forward()
        req.complete_one()  # 这一段已进 KV cache；下一轮只算刚生成的 1 个 token
        req.append_host(int(logits[0].argmax()))
        phase = "decode"
    return req.output_ids


def hf_greedy(path: Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                         eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def main() -> int:
    torch.set_grad_enabled(False)
    failed = False
    for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"]:
        path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
        model = Step0Model(path)
        set_global_ctx(Context(attn_backend=ContiguousAttention(
            model.n_layers, n_slots=1, max_len=64, n_kv=model.n_kv, head_dim=model.head_dim)))
        prompt_ids = tokenizer(PROMPT).input_ids
        req = Req(torch.tensor(prompt_ids, dtype=torch.int32), table_idx=0, cached_len=0,
                  output_len=MAX_TOKENS, uid=0, sampling_params=SamplingParams(max_tokens=16))
        print(f"[{name}] 新建请求 {req}")
        ours = generate(model, req)
        theirs = hf_greedy(path, prompt_ids, MAX_TOKENS)
        print(f"  生成结束   {req}")
        print(f"  {PROMPT!r} → {tokenizer.decode(ours)!r}")
        same = sum(a == b for a, b in zip(ours, theirs))
        print(f"  与 HF 逐 token 一致: {same}/{MAX_TOKENS}" + ("" if ours == theirs else "  ← 不一致！"))
        failed |= ours != theirs
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
