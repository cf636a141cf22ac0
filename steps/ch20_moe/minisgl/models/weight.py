from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from minisgl.distributed import get_tp_info
from minisgl.layers import vocab_shard

from .config import ModelConfig

# Checkpoint tensors that our layers hold fused: (fused name, [the parts, in output order]).
FUSED = [("qkv_proj", ["q_proj", "k_proj", "v_proj"]), ("gate_up_proj", ["gate_proj", "up_proj"])]
# Mixture-of-experts checkpoints store every expert apart ('mlp.experts.7.up_proj.weight'); our
# layer holds them stacked: w13 [experts, 2 * inter, hidden] (gate rows, then up rows) and
# w2 [experts, hidden, inter]. The router ('mlp.gate.weight') is an ordinary, replicated tensor.
EXPERT = re.compile(r"(?P<experts>.+\.experts)\.(?P<index>\d+)"
                    r"\.(?P<part>gate_proj|up_proj|down_proj)\.weight")
EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")
# Derivable buffers some checkpoints still carry; the layers recompute them.
DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)
# How tensor parallelism splits each checkpoint tensor, by the module that holds it: the
# output rows (column-parallel), the input columns (row-parallel), or the vocabulary rows.
# An expert's gate/up/down are split like a dense MLP's. Anything else (norms, q/k-norm, the
# MoE router 'gate') is replicated.
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


def read_shard(f: Any, name: str) -> torch.Tensor:
    """This rank's part of checkpoint tensor `name`, read from the open safetensors file `f`
    without reading the rest: no rank ever holds the whole model."""
    tp = get_tp_info()
    if tp.size == 1:
        return f.get_tensor(name)
    whole = f.get_slice(name)
    rows, *_ = whole.get_shape()
    *_, module, kind = name.split(".")
    # q/k/v rows are whole heads, gate/up rows whole units; a bias (Qwen2's q/k/v) is cut
    # with its weight's rows, so each rank adds the bias of its own heads.
    if module in COLUMN_PARALLEL:
        n = rows // tp.size
        return whole[tp.rank * n : (tp.rank + 1) * n]
    if module in ROW_PARALLEL and kind == "weight":  # a bias is added once, after the sum
        n = whole.get_shape()[1] // tp.size
        return whole[:, tp.rank * n : (tp.rank + 1) * n]
    if module in VOCAB_PARALLEL:
        start, length = vocab_shard(rows)
        part = whole[start : start + length]
        return torch.cat([part, part.new_zeros(length - len(part), *part.shape[1:])])
    return f.get_tensor(name)


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
    concatenated, experts stacked (this rank's shards of each), a tied lm_head dropped, cast
    to `dtype` on `device`."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model directory {str(path)!r} has no *.safetensors file")
    state: dict[str, torch.Tensor] = {}
    fused: dict[str, list[str]] = {}  # fused name -> its parts' names, read into `state` first
    experts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}  # '...experts' -> its tensors
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(DERIVED_SUFFIXES):
                    continue
                if config.tie_word_embeddings and name == "lm_head.weight":
                    continue  # tied: the LM head reads the embedding matrix
                tensor = read_shard(f, name).to(device=device, dtype=dtype)
                if (expert := EXPERT.fullmatch(name)) is not None:  # stacked, not gate_up-fused
                    key = (int(expert["index"]), expert["part"])
                    experts.setdefault(expert["experts"], {})[key] = tensor
                    continue
                state[name] = tensor
                if (parts := _fused_name(name)) is not None:
                    fused[parts[0]] = parts[1]
    for fused_name, parts in fused.items():
        state[fused_name] = _concatenate(fused_name, [(p, state.pop(p, None)) for p in parts])
    for prefix, tensors in experts.items():
        state[f"{prefix}.w13"], state[f"{prefix}.w2"] = _stack_experts(
            prefix, tensors, config.num_experts)
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


def _stack_experts(prefix: str, tensors: dict[tuple[int, str], torch.Tensor],
                   num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One MoE layer's experts, checked and stacked: (w13, w2). Every expert 0..num_experts-1
    must be there with all three parts, each shaped like expert 0's (up like gate)."""
    def name(index: int, part: str) -> str:
        return f"{prefix}.{index}.{part}.weight"

    for index, part in sorted(tensors):
        if index >= num_experts:
            raise KeyError(f"checkpoint has {name(index, part)!r}, but config.json says "
                           f"num_experts={num_experts}")
    for index in range(num_experts):
        for part in EXPERT_PARTS:
            if (index, part) not in tensors:
                raise KeyError(f"checkpoint is missing {name(index, part)!r}: config.json says "
                               f"num_experts={num_experts}")
            like = "gate_proj" if part == "up_proj" else part
            tensor, first = tensors[index, part], tensors[0, like]
            if tensor.shape != first.shape:
                raise ValueError(f"tensor {name(index, part)!r} has shape {tuple(tensor.shape)}; "
                                 f"{name(0, like)!r} has {tuple(first.shape)}")
    w13 = torch.stack([torch.cat([tensors[i, "gate_proj"], tensors[i, "up_proj"]])
                       for i in range(num_experts)])
    w2 = torch.stack([tensors[i, "down_proj"] for i in range(num_experts)])
    return w13, w2
