from __future__ import annotations

from .llama import LlamaForCausalLM
from .registry import MODELS


@MODELS.register("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 is Llama's decoder plus an RMSNorm on every head of q and k before RoPE."""

    qk_norm = True
