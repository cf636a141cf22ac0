"""Models: configuration, architectures registered by their HF name, and weight loading."""

from __future__ import annotations

from pathlib import Path

import torch

from . import llama, mistral, qwen2, qwen3  # noqa: F401  (registers the architectures)
from .base import CausalLM
from .config import ModelConfig
from .registry import MODELS, create_model
from .weight import read_checkpoint


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> CausalLM:
    """Build the model that config.json names and load its safetensors weights."""
    config = ModelConfig.from_dir(path)
    device = torch.device(device)
    with torch.device(device):  # non-parameter tables (RoPE) are created where they are used
        model = create_model(config)
    model.load_state_dict(read_checkpoint(Path(path), config, dtype, device))
    return model
