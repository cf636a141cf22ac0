from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only model, read from a Hugging Face config.json."""

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None for plain RoPE
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model directory {str(path)!r} has no config.json")
        return cls.from_hf(json.loads((path / "config.json").read_text()))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        # transformers 5 nests rope_theta and the scaling under rope_parameters; 4.x keeps
        # rope_theta at the top and the scaling in rope_scaling.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope_scaling = None
        else:
            rope_scaling = {"rope_type": rope.get("rope_type", rope.get("type")), **rope}
        if hf.get("hidden_act", "silu") != "silu":  # the MLPs here are SwiGLU
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu'")
        num_q_heads = hf["num_attention_heads"]
        return cls(
            architecture=(hf.get("architectures") or ["LlamaForCausalLM"])[0],
            num_layers=hf["num_hidden_layers"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_q_heads=num_q_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_q_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_q_heads,
            vocab_size=hf["vocab_size"],
            rms_norm_eps=hf["rms_norm_eps"],
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
        )
