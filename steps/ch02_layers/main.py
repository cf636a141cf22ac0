"""第 2 章：算子层。每一层装上真实权重，和 transformers 里对应的模块逐个比较输出。

SmolLM2 的第 0 层：embedding、RMSNorm、融合 add+RMSNorm、融合 QKV、RoPE、SwiGLU MLP、LM head；
tiny-qwen3 的 q/k-norm；tiny-llama 的 Llama 3 RoPE 缩放（位置超过 1000）。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from minisgl.layers import (Embedding, FusedAddRMSNorm, LMHead, Linear, MergedLinear, QKVLinear,
                            RMSNorm, RotaryEmbedding, SiluAndMul)

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
TOLERANCE = 1e-5
results: list[bool] = []


def report(name: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    diff = (ours - theirs).abs().max().item()
    ok = ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=TOLERANCE, rtol=TOLERANCE)
    print(f"  {name:<34} 形状 {str(tuple(ours.shape)):<16} 最大误差 {diff:.2e}  {'✓' if ok else '✗'}")
    results.append(ok)


def hf_model(name: str):
    return AutoModelForCausalLM.from_pretrained(MODELS / name, dtype=torch.float32)


def hf_rope(hf, x: torch.Tensor, positions: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers 的做法：rotary_emb 给出 cos/sin，apply_rotary_pos_emb 旋转 [1, 头, 序列, 维]。"""
    cos, sin = hf.model.rotary_emb(x, positions[None])
    heads = x.view(len(positions), n_heads, -1).transpose(0, 1)[None]
    rotated, _ = apply_rotary_pos_emb(heads, heads, cos, sin)
    return rotated[0].transpose(0, 1).reshape(len(positions), -1)


def check_smollm2() -> None:
    hf = hf_model("SmolLM2-135M-Instruct")
    cfg, layer = hf.config, hf.model.layers[0]
    n_q, n_kv, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    print(f"[SmolLM2-135M-Instruct 第 0 层] hidden={cfg.hidden_size} 头数 {n_q}/{n_kv} head_dim={head_dim}")
    token_ids = torch.tensor([504, 3575, 282, 4649, 314, 7042, 30])
    positions = torch.arange(len(token_ids))

    embed = Embedding(cfg.vocab_size, cfg.hidden_size)
    embed.load_state_dict({"weight": hf.model.embed_tokens.weight})
    x = embed.forward(token_ids)
    report("Embedding", x, hf.model.embed_tokens(token_ids))

    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    norm.load_state_dict({"weight": layer.input_layernorm.weight})
    h = norm.forward(x)
    report("RMSNorm", h, layer.input_layernorm(x))

    fused = FusedAddRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    fused.load_state_dict({"weight": layer.post_attention_layernorm.weight})
    delta = torch.randn_like(x)
    normed, residual = fused.forward(delta.clone(), x.clone())
    report("FusedAddRMSNorm（add 后的残差）", residual, x + delta)
    report("FusedAddRMSNorm（归一化结果）", normed, layer.post_attention_layernorm(x + delta))

    attn = layer.self_attn
    qkv = QKVLinear(cfg.hidden_size, n_q, n_kv, head_dim)
    qkv.load_state_dict({"weight": torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                              attn.v_proj.weight])})
    q, k, v = qkv.forward(h).split(qkv.output_sizes, dim=-1)
    report("QKVLinear（q 部分）", q, attn.q_proj(h))
    report("QKVLinear（k 部分）", k, attn.k_proj(h))
    report("QKVLinear（v 部分）", v, attn.v_proj(h))

    rope = RotaryEmbedding(head_dim, cfg.max_position_embeddings, cfg.rope_parameters["rope_theta"])
    q_rot, k_rot = rope.forward(positions, q.clone(), k.clone())
    report("RotaryEmbedding（q）", q_rot, hf_rope(hf, q, positions, n_q))
    report("RotaryEmbedding（k）", k_rot, hf_rope(hf, k, positions, n_kv))

    mlp = layer.mlp
    gate_up = MergedLinear(cfg.hidden_size, [cfg.intermediate_size] * 2)
    gate_up.load_state_dict({"weight": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])})
    down = Linear(cfg.intermediate_size, cfg.hidden_size)
    down.load_state_dict({"weight": mlp.down_proj.weight})
    report("gate_up + SiluAndMul + down", down.forward(SiluAndMul().forward(gate_up.forward(h))),
           mlp(h))

    lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, tied_embedding=embed)
    report("LMHead（与 embedding 共享权重）", lm_head.forward(h), hf.lm_head(h))


def check_qk_norm() -> None:
    hf = hf_model("tiny-qwen3")
    attn, cfg = hf.model.layers[0].self_attn, hf.config
    print(f"[tiny-qwen3 第 0 层] q/k-norm：每个头单独做 RMSNorm（head_dim={cfg.head_dim}）")
    q = torch.randn(7, cfg.num_attention_heads, cfg.head_dim)
    q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
    q_norm.load_state_dict({"weight": attn.q_norm.weight})
    report("RMSNorm 作为 q_norm", q_norm.forward(q), attn.q_norm(q))


def check_llama3_rope() -> None:
    hf = hf_model("tiny-llama")
    cfg = hf.config
    scaling = cfg.rope_parameters
    print(f"[tiny-llama] RoPE 缩放 rope_type={scaling['rope_type']} factor={scaling['factor']}")
    positions = torch.tensor([0, 1, 511, 512, 1000, 2047, 4095])
    q = torch.randn(len(positions), cfg.num_attention_heads * cfg.head_dim)
    rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, scaling["rope_theta"], scaling)
    q_rot, _ = rope.forward(positions, q.clone(), q[:, : cfg.head_dim].clone())
    report("RotaryEmbedding（llama3，位置到 4095）", q_rot,
           hf_rope(hf, q, positions, cfg.num_attention_heads))


def main() -> int:
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    check_smollm2()
    check_qk_norm()
    check_llama3_rope()
    print(f"{sum(results)}/{len(results)} 项与 transformers 一致（atol = rtol = {TOLERANCE}）")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
