"""Models: configuration, architectures registered by their HF name, and weight loading."""

from __future__ import annotations

from pathlib import Path

import torch

from minisgl.distributed import TPInfo, get_tp_info, set_tp_info

from . import llama, mistral, qwen2, qwen3, qwen3_moe  # noqa: F401  (register the models)
from .base import CausalLM
from .config import ModelConfig
from .registry import MODELS, create_model
from .weight import read_checkpoint


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> CausalLM:
    """Build the model that config.json names and load its safetensors weights (this TP
    rank's shards of them)."""
    config = ModelConfig.from_dir(path)
    device = torch.device(device)
    with torch.device(device):  # non-parameter tables (RoPE) are created where they are used
        model = create_model(config)
    model.load_state_dict(read_checkpoint(Path(path), config, dtype, device))
    return model


def check_tensor_parallel(path: str | Path, tp_size: int) -> None:
    """Build the model as rank 0 of `tp_size` would, on the meta device (no memory, no
    weights): a head count that does not divide fails here with its reason, in the launcher,
    before any rank process starts."""
    if tp_size == 1:  # one rank splits nothing
        return
    previous = get_tp_info()
    set_tp_info(TPInfo(0, tp_size))
    try:
        with torch.device("meta"):
            create_model(ModelConfig.from_dir(path))
    finally:
        set_tp_info(previous)
