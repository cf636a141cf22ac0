from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.layers import (AttentionLayer, BaseOP, Embedding, FusedAddRMSNorm, LMHead,
                            MergedLinear, OPList, QKVLinear, RMSNorm, RotaryEmbedding,
                            RowParallelLinear)

from .base import CausalLM
from .config import ModelConfig
from .registry import MODELS


class SelfAttention(BaseOP):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding,
                 qk_norm: bool) -> None:
        c, tp = config, get_tp_info()
        # This rank's heads: qkv_proj computes only them (and checks they divide evenly),
        # o_proj takes them in and sums its partial product with the other ranks'.
        self.qkv_proj = QKVLinear(c.hidden_size, c.num_q_heads, c.num_kv_heads, c.head_dim,
                                  bias=c.attention_bias)
        self.o_proj = RowParallelLinear(c.num_q_heads * c.head_dim, c.hidden_size)
        if qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self._attn = AttentionLayer(layer_id, c.num_q_heads // tp.size,
                                    c.num_kv_heads // tp.size, c.head_dim, rotary,
                                    self.q_norm if qk_norm else None,
                                    self.k_norm if qk_norm else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self._attn.forward(self.qkv_proj.forward(x)))


class GatedMLP(BaseOP):
    def __init__(self, config: ModelConfig) -> None:
        self.gate_up_proj = MergedLinear(config.hidden_size, [config.intermediate_size] * 2)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate_up_proj and silu(gate) * up in one op (chapter 19: one GEMV at a few rows)
        return self.down_proj.forward(self.gate_up_proj.forward_silu_and_mul(x))


class DecoderLayer(BaseOP):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding,
                 qk_norm: bool) -> None:
        self.input_layernorm = FusedAddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, layer_id, rotary, qk_norm)
        self.post_attention_layernorm = FusedAddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # Pre-norm blocks; each norm also adds the previous block's output into the residual.
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class DecoderModel(BaseOP):
    def __init__(self, config: ModelConfig, qk_norm: bool) -> None:
        rotary = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta,
                                 config.rope_scaling)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = OPList([DecoderLayer(config, i, rotary, qk_norm)
                              for i in range(config.num_layers)])
        self.norm = FusedAddRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens.forward(token_ids), None
        for layer in self.layers:
            x, residual = layer.forward(x, residual)
        return self.norm.forward(x, residual)[0]


@MODELS.register("LlamaForCausalLM")
class LlamaForCausalLM(CausalLM):
    qk_norm = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = DecoderModel(config, self.qk_norm)
        tied = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tied)

    def forward(self) -> torch.Tensor:
        batch = get_global_ctx().batch
        hidden = self.model.forward(batch.input_ids)
        # Only each request's last token predicts the next one: score just those rows.
        return self.lm_head.forward(hidden[batch.attn_metadata.last_indices])
