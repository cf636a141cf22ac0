from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig

# Checkpoint tensors that our layers hold fused: (fused name, [the parts, in output order]).
FUSED = [("qkv_proj", ["q_proj", "k_proj", "v_proj"]), ("gate_up_proj", ["gate_proj", "up_proj"])]
# Derivable buffers some checkpoints still carry; the layers recompute them.
DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def _fused_name(name: str) -> tuple[str, list[str]] | None:
    """'m.0.self_attn.k_proj.weight' -> ('m.0.self_attn.qkv_proj.weight', the names of its q, k
    and v parts): the fused tensor `name` is a part of, and all its parts in output order."""
    *module, part, kind = name.split(".")
    for fused, parts in FUSED:
        if part in parts:
            return ".".join([*module, fused, kind]), [".".join([*module, p, kind]) for p in parts]
    return None


def read_checkpoint(path: Path, config: ModelConfig, dtype: torch.dtype,
                    device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint under the model's own names: q/k/v and gate/up
    concatenated, a tied lm_head dropped, cast to `dtype` on `device`."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model directory {str(path)!r} has no *.safetensors file")
    state: dict[str, torch.Tensor] = {}
    fused: dict[str, list[str]] = {}  # fused name -> its parts' names, read into `state` first
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(DERIVED_SUFFIXES):
                    continue
                if config.tie_word_embeddings and name == "lm_head.weight":
                    continue  # tied: the LM head reads the embedding matrix
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
                if (parts := _fused_name(name)) is not None:
                    fused[parts[0]] = parts[1]
    for fused_name, parts in fused.items():
        state[fused_name] = _concatenate(fused_name, [(p, state.pop(p, None)) for p in parts])
    return state


def _concatenate(fused_name: str, parts: list[tuple[str, torch.Tensor | None]]) -> torch.Tensor:
    """The (name, tensor) parts of one fused tensor, checked and concatenated in output order."""
    present = []
    for part_name, tensor in parts:
        if tensor is None:
            raise KeyError(f"checkpoint is missing {part_name!r}, a part of {fused_name!r}")
        if present and tensor.shape[1:] != present[0].shape[1:]:
            raise ValueError(f"tensor {part_name!r} has shape {tuple(tensor.shape)}; "
                             f"{parts[0][0]!r} has {tuple(present[0].shape)}")
        present.append(tensor)
    return torch.cat(present)
