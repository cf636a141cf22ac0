"""models: config.json parsing, the model registry, loading (meta slots, tied embeddings), the
error cases of weight loading on edited copies of tiny-llama, and the name Registry. (Logits
against transformers need chapter 5's attention backend: tests/test_attention.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import (MODELS_DIR, SMOLLM2, TINY_LLAMA, TINY_MISTRAL, TINY_QWEN2, TINY_QWEN3,
                      load_error)
from minisgl.models import MODELS, CausalLM, ModelConfig, create_model, load_model, read_checkpoint
from minisgl.utils import Registry

CHAPTER = 3  # tools/steps.py check runs this module on chapter 3's own tree

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                  "low_freq_factor": 1.0, "original_max_position_embeddings": 512}


# --- ModelConfig ---------------------------------------------------------------------------------

def assert_fields(config: ModelConfig, **expected) -> None:
    """Each named field of `config` has the expected value (a mismatch shows every field)."""
    assert {name: getattr(config, name) for name in expected} == expected


def test_config_of_smollm2(smollm2_path):
    c = ModelConfig.from_dir(smollm2_path)
    assert_fields(c, architecture="LlamaForCausalLM", num_layers=30, hidden_size=576,
                  intermediate_size=1536, num_q_heads=9, num_kv_heads=3, head_dim=64,
                  vocab_size=49152, rope_theta=100000.0, rope_scaling=None, max_position=8192)
    assert c.tie_word_embeddings is True and c.attention_bias is False
    assert c.rms_norm_eps == pytest.approx(1e-5)


def test_config_of_tiny_qwen3(tiny_qwen3_path):
    c = ModelConfig.from_dir(tiny_qwen3_path)
    assert_fields(c, architecture="Qwen3ForCausalLM", num_layers=4, hidden_size=128,
                  intermediate_size=256, num_q_heads=8, num_kv_heads=4, head_dim=32,
                  vocab_size=49152, rope_theta=1e6, rope_scaling=None, max_position=4096)
    assert c.tie_word_embeddings is False and c.rms_norm_eps == 1e-6


def test_config_of_tiny_llama_parses_llama3_rope_parameters(tiny_llama_path):
    c = ModelConfig.from_dir(tiny_llama_path)
    assert (c.architecture, c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim) == \
        ("LlamaForCausalLM", 4, 8, 4, 32)
    assert c.rope_theta == 500000.0 and c.tie_word_embeddings is True
    assert c.rope_scaling == LLAMA3_SCALING


@pytest.mark.parametrize("name, architecture, tied", [
    (TINY_QWEN2, "Qwen2ForCausalLM", True), (TINY_MISTRAL, "MistralForCausalLM", False)])
def test_config_of_tiny_qwen2_and_tiny_mistral(name, architecture, tied):
    c = ModelConfig.from_dir(MODELS_DIR / name)
    assert (c.architecture, c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim) == \
        (architecture, 4, 8, 4, 32)
    assert (c.rope_theta, c.rope_scaling, c.max_position) == (1e6, None, 4096)
    assert c.tie_word_embeddings is tied


def base_hf_config(**extra) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "rms_norm_eps": 1e-6, **extra}


def test_config_parses_4x_rope_theta_and_rope_scaling():
    scaling = {k: v for k, v in LLAMA3_SCALING.items()}
    c = ModelConfig.from_hf(base_hf_config(rope_theta=500000.0, rope_scaling=scaling))
    assert c.rope_theta == 500000.0 and c.rope_scaling == LLAMA3_SCALING


def test_config_parses_4x_legacy_type_key():
    c = ModelConfig.from_hf(base_hf_config(
        rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 1024}))
    assert c.rope_theta == 1e6
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["factor"] == 4.0


def test_config_4x_without_scaling_is_plain_rope():
    c = ModelConfig.from_hf(base_hf_config(rope_theta=12345.0, rope_scaling=None))
    assert (c.rope_theta, c.rope_scaling) == (12345.0, None)


def test_config_defaults_kv_heads_and_head_dim():
    hf = base_hf_config()
    del hf["num_key_value_heads"]
    c = ModelConfig.from_hf(hf)
    assert (c.num_kv_heads, c.head_dim, c.rope_theta) == (4, 16, 10000.0)


def test_config_from_dir_reads_a_4x_config_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        base_hf_config(rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING))))
    c = ModelConfig.from_dir(tmp_path)
    assert c.rope_theta == 500000.0 and c.rope_scaling == LLAMA3_SCALING


# --- refused configurations: served wrongly otherwise --------------------------------------------

def test_mistral_sliding_window_shorter_than_the_context_is_refused():
    hf = base_hf_config(architectures=["MistralForCausalLM"], sliding_window=4096,
                        max_position_embeddings=32768)
    with pytest.raises(ValueError) as info:
        ModelConfig.from_hf(hf)
    message = str(info.value)
    assert "sliding_window=4096" in message and "max_position_embeddings=32768" in message
    assert "Set max_position_embeddings to 4096" in message


def test_qwen2_sliding_window_counts_only_when_switched_on():
    hf = base_hf_config(architectures=["Qwen2ForCausalLM"], sliding_window=1024,
                        max_position_embeddings=32768, use_sliding_window=False)
    assert ModelConfig.from_hf(hf).max_position == 32768  # a setting only: every layer is full
    with pytest.raises(ValueError, match="sliding_window=1024"):
        ModelConfig.from_hf({**hf, "use_sliding_window": True})


@pytest.mark.parametrize("window", [None, 32768, 65536])
def test_a_window_covering_the_whole_context_is_full_attention(window):
    hf = base_hf_config(architectures=["MistralForCausalLM"], sliding_window=window,
                        max_position_embeddings=32768)
    assert ModelConfig.from_hf(hf).max_position == 32768


def test_a_multimodal_config_is_refused_by_name():
    hf = {"architectures": ["Mistral3ForConditionalGeneration"], "text_config": base_hf_config()}
    with pytest.raises(ValueError, match=r"Mistral3ForConditionalGeneration.*text_config"):
        ModelConfig.from_hf(hf)


# --- the model registry ---------------------------------------------------------------------------

def test_registry_knows_the_four_architectures():
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM",
            "MistralForCausalLM"} <= set(MODELS.names())


def test_qwen2_has_q_k_v_biases_and_no_o_proj_bias():
    config = ModelConfig.from_dir(MODELS_DIR / TINY_QWEN2)
    assert config.attention_bias is False  # Qwen2's config.json has no such field
    attn = create_model(config).model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.qkv_proj.bias.shape == ((8 + 2 * 4) * 32,)
    assert attn.o_proj.bias is None


def test_mistral_ignores_attention_bias_like_transformers():
    config = ModelConfig.from_hf(base_hf_config(architectures=["MistralForCausalLM"],
                                                attention_bias=True))
    assert create_model(config).model.layers[0].self_attn.qkv_proj.bias is None


@pytest.mark.parametrize("name", [TINY_QWEN3, TINY_QWEN2, TINY_MISTRAL])
def test_model_parameters_are_the_checkpoint_names_fused(name):
    path = MODELS_DIR / name
    config = ModelConfig.from_dir(path)
    names = set(create_model(config).state_dict())
    fused_as = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}

    def fused(name: str) -> str:
        *module, part, kind = name.split(".")
        return ".".join([*module, fused_as.get(part, part), kind])

    checkpoint = load_file(path / "model.safetensors")
    if config.tie_word_embeddings:
        checkpoint.pop("lm_head.weight", None)
    assert names == {fused(name) for name in checkpoint}
    if name == TINY_QWEN3:
        assert "model.layers.0.self_attn.q_norm.weight" in names and "lm_head.weight" in names
    if name == TINY_QWEN2:
        assert "model.layers.0.self_attn.qkv_proj.bias" in names


def test_created_model_is_all_meta_until_loaded(tiny_llama_path):
    model = create_model(ModelConfig.from_dir(tiny_llama_path))
    assert all(t.is_meta for t in model.state_dict().values())


def test_loaded_model_has_no_meta_tensor(our_model):
    assert not any(t.is_meta for t in our_model(TINY_QWEN3).state_dict().values())


def test_tied_model_has_no_lm_head_weight(our_model):
    assert "lm_head.weight" not in our_model(TINY_LLAMA).state_dict()


# --- weight loading errors on an edited copy of tiny-llama --------------------------------------

def test_missing_fused_part_is_named(model_copy):
    path = model_copy(TINY_LLAMA, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(path)


def test_missing_plain_tensor_is_named(model_copy):
    path = model_copy(TINY_LLAMA, lambda s: s.pop("model.layers.2.mlp.down_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.2\.mlp\.down_proj\.weight"):
        load_model(path)


def test_unexpected_tensor_is_named(model_copy):
    path = model_copy(TINY_LLAMA, lambda s: s.update(
        {"model.layers.0.mlp.extra_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(KeyError, match=r"model\.layers\.0\.mlp\.extra_proj\.weight"):
        load_model(path)


def test_shape_mismatch_names_tensor_and_both_shapes(model_copy):
    path = model_copy(TINY_LLAMA, lambda s: s.update(
        {"model.layers.0.self_attn.o_proj.weight": torch.zeros(128, 128)}))
    message = load_error(path)
    assert "model.layers.0.self_attn.o_proj.weight" in message
    assert "(128, 128)" in message and "(128, 256)" in message


def test_shape_mismatch_in_a_fused_part_names_that_part(model_copy):
    # k_proj with the wrong input size: q/k/v can no longer be concatenated. The error should
    # still say which checkpoint tensor is wrong, like every other loading error does.
    path = model_copy(TINY_LLAMA, lambda s: s.update(
        {"model.layers.0.self_attn.k_proj.weight": torch.zeros(128, 64)}))
    assert "model.layers.0.self_attn.k_proj.weight" in load_error(path)


def test_derived_rotary_inv_freq_is_ignored(model_copy, our_model):
    path = model_copy(TINY_LLAMA, lambda s: s.update({
        f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(16) for i in range(4)}))
    config = ModelConfig.from_dir(path)
    state = read_checkpoint(path, config, torch.float32, torch.device("cpu"))
    assert not any("inv_freq" in name for name in state)
    model = load_model(path)
    reference = our_model(TINY_LLAMA)
    assert all(torch.equal(t, reference.state_dict()[n]) for n, t in model.state_dict().items())


def test_unknown_architecture_lists_the_known_ones(model_copy):
    path = model_copy(TINY_LLAMA)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    message = load_error(path)
    assert "'MambaForCausalLM'" in message
    assert "LlamaForCausalLM" in message and "Qwen3ForCausalLM" in message


def test_missing_model_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_model(missing)


def test_directory_without_config_json_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    message = load_error(tmp_path, FileNotFoundError)
    assert str(tmp_path) in message and "config.json" in message


def test_directory_without_safetensors_is_named(model_copy):
    path = model_copy(TINY_LLAMA)
    (path / "model.safetensors").unlink()
    message = load_error(path, FileNotFoundError)
    assert str(path) in message and "safetensors" in message


# The name registry arrives with the model registry (utils/registry.py, chapter 3).
# --- Registry ----------------------------------------------------------------------------------

def test_registry_returns_what_was_registered_under_each_name():
    registry: Registry[type] = Registry("widget")

    @registry.register("a", "alias")
    class A:
        pass

    assert registry.get("a") is A and registry.get("alias") is A
    assert registry.names() == ["a", "alias"]


def test_registry_unknown_name_lists_the_known_ones():
    registry: Registry[int] = Registry("widget")
    registry.register("beta")(2)
    registry.register("alpha")(1)
    with pytest.raises(ValueError) as info:
        registry.get("gamma")
    message = str(info.value)
    assert "widget" in message and "'gamma'" in message and "alpha, beta" in message


def test_registry_double_registration_raises():
    registry: Registry[int] = Registry("widget")
    registry.register("x")(1)
    with pytest.raises(ValueError, match="'x'.*twice"):
        registry.register("x")(2)
    assert registry.get("x") == 1


# --- the chapter's example ---

import ast  # noqa: E402
import re  # noqa: E402

from safetensors import safe_open  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_builds_smollm2_from_its_config_and_names_the_failures():
    out = run_example("ch03_models.py")
    hf = json.loads((MODELS_DIR / SMOLLM2 / "config.json").read_text())
    config_line = out.splitlines()[0]
    for field, value in [("architecture", f"'{hf['architectures'][0]}'"),
                         ("num_layers", hf["num_hidden_layers"]),
                         ("hidden_size", hf["hidden_size"]),
                         ("intermediate_size", hf["intermediate_size"]),
                         ("num_q_heads", hf["num_attention_heads"]),
                         ("num_kv_heads", hf["num_key_value_heads"]),
                         ("head_dim", hf["hidden_size"] // hf["num_attention_heads"]),
                         ("vocab_size", hf["vocab_size"]),
                         ("tie_word_embeddings", hf["tie_word_embeddings"])]:
        assert f"{field}={value}," in config_line, field
    # The checkpoint's tensors, with q/k/v fused into one and gate/up into one per layer; a tied
    # lm_head is the embedding, not a tensor of its own.
    with safe_open(MODELS_DIR / SMOLLM2 / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    expected = len(keys) - 3 * hf["num_hidden_layers"]
    if hf["tie_word_embeddings"] and "lm_head.weight" in keys:
        expected -= 1
    count, first, last = re.search(r"^(\d+) 个参数张量.*比如 (\[.*\]) … (\[.*\])$", out,
                                   re.M).groups()
    assert int(count) == expected
    for name in ast.literal_eval(first) + ast.literal_eval(last):
        unfused = name.replace("qkv_proj", "q_proj").replace("gate_up_proj", "gate_proj")
        assert unfused in keys, name
    names = ast.literal_eval(re.search(r"^注册过的结构： (\[.*\])$", out, re.M).group(1))
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM",
            "MistralForCausalLM"} <= set(names)
    # The book's format: what kind of thing, what was asked for, what exists.
    assert (f"ValueError: unknown model architecture 'MysteryForCausalLM'; known: "
            f"{', '.join(names)}") in out
    assert re.search(r"^FileNotFoundError: .*'models/does-not-exist'", out, re.M)
