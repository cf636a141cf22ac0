from __future__ import annotations

from minisgl.layers import BaseOP, MoE

from .llama import GatedMLP
from .qwen3 import Qwen3ForCausalLM
from .registry import MODELS


@MODELS.register("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE is Qwen3 whose MLPs are mixtures of experts: every decoder_sparse_step-th
    layer, except those listed in mlp_only_layers, which keep a dense MLP."""

    def build_mlp(self, layer_id: int) -> BaseOP:
        c = self.config
        if not c.is_moe_layer(layer_id):
            return GatedMLP(c)
        return MoE(c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                   c.norm_topk_prob)
