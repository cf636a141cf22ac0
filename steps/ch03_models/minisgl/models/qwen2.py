from __future__ import annotations

from dataclasses import replace

from .config import ModelConfig
from .llama import LlamaForCausalLM
from .registry import MODELS


@MODELS.register("Qwen2ForCausalLM")
class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 is Llama's decoder with biases on the q, k and v projections (not on o_proj).
    They are always there, so Qwen2's config.json has no attention_bias field to say so."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(replace(config, attention_bias=True))
