from __future__ import annotations

from minisgl.utils import Registry

from .base import CausalLM
from .config import ModelConfig

# HF `architectures` name -> model class; each model module registers itself on import.
MODELS: Registry[type[CausalLM]] = Registry("model architecture")


def create_model(config: ModelConfig) -> CausalLM:
    return MODELS.get(config.architecture)(config)
