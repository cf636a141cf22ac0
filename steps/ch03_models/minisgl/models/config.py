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
    attention_bias: bool  # q, k and v projections with biases

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
        if "text_config" in hf:  # e.g. Mistral3ForConditionalGeneration: a vision model too
            raise ValueError(f"config.json of {hf.get('architectures')} nests its language model "
                             f"in text_config; only text-only checkpoints are supported")
        # transformers 5 nests rope_theta and the scaling under rope_parameters; 4.x keeps
        # rope_theta at the top and the scaling in rope_scaling.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        kind = rope.setdefault("rope_type", rope.get("type", "default"))  # older files: "type"
        if hf.get("hidden_act", "silu") != "silu":  # the MLPs here are SwiGLU
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu'")
        max_position = hf.get("max_position_embeddings", 4096)
        _check_no_sliding_window(hf, max_position)
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
            rope_scaling=None if kind == "default" else rope,
            max_position=max_position,
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
        )


def _check_no_sliding_window(hf: dict[str, Any], max_position: int) -> None:
    """Refuse a model whose layers attend only to the last `sliding_window` tokens: every layer
    here attends to the whole context, which is the same thing only while the context fits in
    the window. (Mistral slides whenever sliding_window is set; Qwen2 and Qwen3 carry a window
    size but use it only with use_sliding_window.)"""
    window = hf.get("sliding_window")
    if window is None or not hf.get("use_sliding_window", True) or window >= max_position:
        return
    raise ValueError(
        f"sliding_window={window} is shorter than max_position_embeddings={max_position}, and "
        f"sliding-window attention is not implemented here: longer contexts would be served "
        f"wrongly. Set max_position_embeddings to {window} in config.json to serve only "
        f"contexts the window covers, or use a checkpoint with sliding_window null")
