from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig

# Checkpoint tensors that our layers hold fused: (fused name, [the parts, in output order]).
FUSED = [("qkv_proj", ["q_proj", "k_proj", "v_proj"]), ("gate_up_proj", ["gate_proj", "up_proj"])]
# Derivable buffers some checkpoints still carry; the layers recompute them.
DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def _fused_name(name: str) -> tuple[str, int, int] | None:
    """'m.layers.0.self_attn.k_proj.weight' -> ('m.layers.0.self_attn.qkv_proj.weight', 1, 3):
    the fused tensor, this part's place in it, and how many parts it has."""
    *module, part, kind = name.split(".")
    for fused, parts in FUSED:
        if part in parts:
            return ".".join([*module, fused, kind]), parts.index(part), len(parts)
    return None


def read_checkpoint(path: Path, config: ModelConfig, dtype: torch.dtype,
                    device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint under the model's own names: q/k/v and gate/up
    concatenated, a tied lm_head dropped, cast to `dtype` on `device`."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model directory {str(path)!r} has no *.safetensors file")
    state: dict[str, torch.Tensor] = {}
    pieces: dict[str, list[torch.Tensor | None]] = {}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(DERIVED_SUFFIXES):
                    continue
                if config.tie_word_embeddings and name == "lm_head.weight":
                    continue  # tied: the LM head reads the embedding matrix
                tensor = f.get_tensor(name).to(device=device, dtype=dtype)
                fused = _fused_name(name)
                if fused is None:
                    state[name] = tensor
                else:
                    fused_name, index, count = fused
                    pieces.setdefault(fused_name, [None] * count)[index] = tensor
    for fused_name, tensors in pieces.items():
        state[fused_name] = _concatenate(fused_name, tensors)
    return state


def _concatenate(fused_name: str, tensors: list[torch.Tensor | None]) -> torch.Tensor:
    """The parts of one fused tensor, checked and concatenated in output order."""
    fused = fused_name.split(".")[-2]
    parts = next(parts for name, parts in FUSED if name == fused)
    named = [(fused_name.replace(f".{fused}.", f".{part}."), t) for part, t in zip(parts, tensors)]
    present = []
    for part_name, tensor in named:
        if tensor is None:
            raise KeyError(f"checkpoint is missing {part_name!r}, a part of {fused_name!r}")
        if present and tensor.shape[1:] != present[0].shape[1:]:
            raise ValueError(f"tensor {part_name!r} has shape {tuple(tensor.shape)}; "
                             f"{named[0][0]!r} has {tuple(present[0].shape)}")
        present.append(tensor)
    return torch.cat(present)
