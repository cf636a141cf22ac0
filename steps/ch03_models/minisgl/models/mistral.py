from __future__ import annotations

from dataclasses import replace

from .config import ModelConfig
from .llama import LlamaForCausalLM
from .registry import MODELS


@MODELS.register("MistralForCausalLM")
class MistralForCausalLM(LlamaForCausalLM):
    """Mistral is Llama's decoder, without biases whatever the config says. Its one difference,
    attention over a sliding window of recent tokens, is refused by ModelConfig unless the
    window covers the whole context (it is null from Mistral 7B v0.2 on)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(replace(config, attention_bias=False))
