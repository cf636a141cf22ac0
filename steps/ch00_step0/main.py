"""第 0 步：一个不依赖 minisgl 的最小推理引擎，和 Hugging Face 逐 token 对齐。

读 config.json 和 safetensors 权重，手写前向（embedding、RMSNorm、RoPE、GQA 注意力、SwiGLU），
用一块连续的 KV cache 做贪心解码，再和 transformers 的 generate 逐个 token 比较。
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPT, MAX_TOKENS = "The capital of France is", 16


class Step0Engine:
    def __init__(self, path: Path, max_len: int = 256):
        cfg = json.loads((path / "config.json").read_text())
        self.w = load_file(path / "model.safetensors")
        self.n_layers, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.n_heads, self.n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.n_heads
        # transformers 5 nests rope_theta under rope_parameters; older configs keep it top level.
        theta = cfg.get("rope_parameters", cfg).get("rope_theta", 10000.0)
        inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(torch.arange(max_len).float(), inv_freq)  # [max_len, head_dim/2]
        self.cos, self.sin = angles.cos(), angles.sin()
        # Contiguous KV cache: one [max_len, n_kv, head_dim] slab per layer for K and for V.
        shape = (self.n_layers, max_len, self.n_kv, self.head_dim)
        self.k_cache, self.v_cache = torch.zeros(shape), torch.zeros(shape)
        tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w
        self.lm_head = self.w["model.embed_tokens.weight" if tied else "lm_head.weight"]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # HF's "rotate half" layout: dimension i pairs with dimension i + head_dim/2.
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x[..., : self.head_dim // 2], x[..., self.head_dim // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def attention(self, i: int, x: torch.Tensor, start: int) -> torch.Tensor:
        p, n = f"model.layers.{i}.self_attn.", x.shape[0]
        q = (x @ self.w[p + "q_proj.weight"].T).view(n, self.n_heads, self.head_dim)
        k = (x @ self.w[p + "k_proj.weight"].T).view(n, self.n_kv, self.head_dim)
        v = (x @ self.w[p + "v_proj.weight"].T).view(n, self.n_kv, self.head_dim)
        if p + "q_norm.weight" in self.w:  # Qwen3 normalises each head of q and k before RoPE
            q = self.rms_norm(q, self.w[p + "q_norm.weight"])
            k = self.rms_norm(k, self.w[p + "k_norm.weight"])
        pos = torch.arange(start, start + n)
        q, k = self.rope(q, pos), self.rope(k, pos)
        self.k_cache[i, start : start + n], self.v_cache[i, start : start + n] = k, v
        keys, values = self.k_cache[i, : start + n], self.v_cache[i, : start + n]
        # Grouped-query attention: each KV head serves n_heads / n_kv query heads.
        group = self.n_heads // self.n_kv
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / self.head_dim**0.5
        # Causal mask: query j (absolute position start + j) sees keys 0 .. start + j.
        mask = torch.arange(start + n)[None, :] > pos[:, None]
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", probs, values).reshape(n, -1)
        return out @ self.w[p + "o_proj.weight"].T

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{i}.mlp."
        gate, up = x @ self.w[p + "gate_proj.weight"].T, x @ self.w[p + "up_proj.weight"].T
        return (F.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    @torch.no_grad()
    def forward(self, token_ids: list[int], start: int) -> torch.Tensor:
        """Run `token_ids` at positions start.. and return the logits of the last one."""
        x = self.w["model.embed_tokens.weight"][torch.tensor(token_ids)]
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            x = x + self.attention(i, self.rms_norm(x, self.w[p + "input_layernorm.weight"]), start)
            x = x + self.mlp(i, self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"]))
        return self.rms_norm(x[-1], self.w["model.norm.weight"]) @ self.lm_head.T

    def generate(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        logits = self.forward(prompt_ids, start=0)  # prefill: the whole prompt in one pass
        out = [int(logits.argmax())]
        while len(out) < max_tokens:  # decode: one new token a step, attending to the cache
            logits = self.forward(out[-1:], start=len(prompt_ids) + len(out) - 1)
            out.append(int(logits.argmax()))
        return out


def hf_greedy(path: Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt_ids])
    # eos_token_id=None：遇到 EOS 不停，也不像 min_new_tokens 那样把 EOS 屏蔽掉，和我们一致
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                         eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def main() -> int:
    torch.set_grad_enabled(False)
    failed = False
    for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"]:
        path = MODELS / name
        tokenizer = AutoTokenizer.from_pretrained(path)
        prompt_ids = tokenizer(PROMPT).input_ids
        ours = Step0Engine(path).generate(prompt_ids, MAX_TOKENS)
        theirs = hf_greedy(path, prompt_ids, MAX_TOKENS)
        same = sum(a == b for a, b in zip(ours, theirs))
        print(f"[{name}] 提示词 {PROMPT!r} → {tokenizer.decode(ours)!r}")
        print(f"  我们的 token: {ours}")
        print(f"  HF 的 token : {theirs}")
        print(f"  逐 token 一致: {same}/{MAX_TOKENS}" + ("" if ours == theirs else "  ← 不一致！"))
        failed |= ours != theirs
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
