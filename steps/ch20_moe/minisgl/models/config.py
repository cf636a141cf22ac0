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
    # Mixture of experts (Qwen3-MoE); the defaults describe a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top_k: the experts each token is routed to
    moe_intermediate_size: int = 0  # one expert's intermediate size
    norm_topk_prob: bool = False  # renormalise the top_k routing weights to sum to 1
    decoder_sparse_step: int = 1  # every step-th layer has experts...
    mlp_only_layers: tuple[int, ...] = ()  # ...unless listed here: then a dense MLP

    def is_moe_layer(self, layer_id: int) -> bool:
        """Whether layer `layer_id` routes through experts; transformers' Qwen3-MoE rule."""
        return (layer_id not in self.mlp_only_layers and self.num_experts > 0
                and (layer_id + 1) % self.decoder_sparse_step == 0)

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
            **_moe_fields(hf),
        )


def _moe_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The experts of a Qwen3-MoE config.json, refusing the variants not implemented here. The
    expert count is `num_experts` in Qwen's own files and `num_local_experts` in those that
    transformers 5 writes."""
    num_experts = hf.get("num_experts") or hf.get("num_local_experts") or 0
    if not num_experts:
        return {}
    for field in ("shared_expert_intermediate_size", "n_shared_experts"):  # Qwen2-MoE, DeepSeek
        if hf.get(field):
            raise ValueError(f"{field}={hf[field]}: shared experts (run for every token besides "
                             f"the routed ones) are not implemented; only Qwen3-MoE's routed "
                             f"experts are")
    fields = dict(num_experts=num_experts,
                  num_experts_per_tok=hf.get("num_experts_per_tok", 0),
                  moe_intermediate_size=hf.get("moe_intermediate_size", 0),
                  norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                  decoder_sparse_step=hf.get("decoder_sparse_step", 1),
                  mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()))
    if not 1 <= fields["num_experts_per_tok"] <= num_experts:
        raise ValueError(f"num_experts_per_tok={fields['num_experts_per_tok']}: each token must "
                         f"be routed to between 1 and num_experts={num_experts} experts")
    if fields["moe_intermediate_size"] < 1:
        raise ValueError(f"moe_intermediate_size={fields['moe_intermediate_size']}: "
                         f"an expert needs an intermediate size of at least 1")
    if fields["decoder_sparse_step"] < 1:
        raise ValueError(f"decoder_sparse_step={fields['decoder_sparse_step']}: every "
                         f"decoder_sparse_step-th layer has experts, so it must be at least 1")
    return fields


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
