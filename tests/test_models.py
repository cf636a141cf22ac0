"""models: config.json parsing, logits against transformers for the three checkpoints, and the
error cases of weight loading on edited copies of tiny-llama."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import SMOLLM2, TINY_LLAMA, TINY_QWEN3
from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.kvcache import MHAKVPool
from minisgl.models import MODELS, CausalLM, ModelConfig, create_model, load_model, read_checkpoint

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                  "low_freq_factor": 1.0, "original_max_position_embeddings": 512}


# --- ModelConfig ---------------------------------------------------------------------------------

def test_config_of_smollm2(smollm2_path):
    c = ModelConfig.from_dir(smollm2_path)
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == \
        ("LlamaForCausalLM", 30, 576, 1536)
    assert (c.num_q_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert (c.rope_theta, c.rope_scaling, c.max_position) == (100000.0, None, 8192)
    assert c.tie_word_embeddings is True and c.attention_bias is False
    assert c.rms_norm_eps == pytest.approx(1e-5)


def test_config_of_tiny_qwen3(tiny_qwen3_path):
    c = ModelConfig.from_dir(tiny_qwen3_path)
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == \
        ("Qwen3ForCausalLM", 4, 128, 256)
    assert (c.num_q_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (8, 4, 32, 49152)
    assert (c.rope_theta, c.rope_scaling, c.max_position) == (1e6, None, 4096)
    assert c.tie_word_embeddings is False and c.rms_norm_eps == 1e-6


def test_config_of_tiny_llama_parses_llama3_rope_parameters(tiny_llama_path):
    c = ModelConfig.from_dir(tiny_llama_path)
    assert (c.architecture, c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim) == \
        ("LlamaForCausalLM", 4, 8, 4, 32)
    assert c.rope_theta == 500000.0 and c.tie_word_embeddings is True
    assert c.rope_scaling == LLAMA3_SCALING


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


# --- logits against transformers -----------------------------------------------------------------

def forward_logits(model: CausalLM, prompts: list[list[int]], page_size: int = 4) -> torch.Tensor:
    """Prefill `prompts` as one batch with the torch backend over a small pool; pages handed out
    in order, page table filled by hand. Returns one row of logits per prompt."""
    c = model.config
    total_pages = sum(-(-len(p) // page_size) for p in prompts)
    pool = MHAKVPool(c.num_layers, total_pages, page_size, c.num_kv_heads, c.head_dim,
                     torch.float32, "cpu")
    max_len = max(len(p) for p in prompts)
    page_table = torch.zeros(len(prompts), max_len, dtype=torch.int32)
    next_page = 0
    for row, prompt in enumerate(prompts):
        for pos in range(len(prompt)):
            if pos % page_size == 0:
                page, next_page = next_page, next_page + 1
            page_table[row, pos] = page * page_size + pos % page_size
    backend = create_attention_backend("torch", pool, page_table)
    ctx = Context(attn_backend=backend)
    set_global_ctx(ctx)
    reqs = [Req(torch.tensor(p, dtype=torch.int32), table_idx=i, cached_len=0, output_len=1,
                uid=i, sampling_params=SamplingParams(max_tokens=1))
            for i, p in enumerate(prompts)]
    batch = Batch(reqs, "prefill")
    batch.input_ids = torch.cat([r.input_ids for r in reqs]).long()
    batch.positions = torch.cat([torch.arange(len(p)) for p in prompts])
    batch.out_loc = torch.cat([page_table[i, :len(p)] for i, p in enumerate(prompts)]).long()
    backend.prepare_metadata(batch)
    with ctx.forward_batch(batch):
        return model.forward()


PROMPTS = [[1, 504, 3458, 282, 4649, 314], [9, 8, 7, 6, 5, 4, 3, 2, 1000, 2000, 3000],
           [17, 42, 42, 17, 3]]


@pytest.mark.parametrize("name", [SMOLLM2, TINY_QWEN3, TINY_LLAMA])
def test_last_token_logits_match_hf(name, hf_model, our_model):
    prompt = PROMPTS[0]
    ours = forward_logits(our_model(name), [prompt])
    theirs = hf_model(name)(torch.tensor([prompt])).logits[:, -1]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", [TINY_QWEN3, TINY_LLAMA])
def test_ragged_batch_logits_match_hf_per_prompt(name, hf_model, our_model):
    ours = forward_logits(our_model(name), PROMPTS)
    hf = hf_model(name)
    theirs = torch.cat([hf(torch.tensor([p])).logits[:, -1] for p in PROMPTS])
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_registry_knows_both_architectures():
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM"} <= set(MODELS.names())


def test_model_parameters_are_the_checkpoint_names_fused(tiny_qwen3_path):
    config = ModelConfig.from_dir(tiny_qwen3_path)
    names = set(create_model(config).state_dict())
    fused_as = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}

    def fused(name: str) -> str:
        *module, part, kind = name.split(".")
        return ".".join([*module, fused_as.get(part, part), kind])

    checkpoint = load_file(tiny_qwen3_path / "model.safetensors")
    assert names == {fused(name) for name in checkpoint}
    assert "model.layers.0.self_attn.q_norm.weight" in names and "lm_head.weight" in names


def test_created_model_is_all_meta_until_loaded(tiny_llama_path):
    model = create_model(ModelConfig.from_dir(tiny_llama_path))
    assert all(t.is_meta for t in model.state_dict().values())


def test_loaded_model_has_no_meta_tensor(our_model):
    assert not any(t.is_meta for t in our_model(TINY_QWEN3).state_dict().values())


def test_tied_model_has_no_lm_head_weight(our_model):
    assert "lm_head.weight" not in our_model(TINY_LLAMA).state_dict()


# --- weight loading errors on an edited copy of tiny-llama --------------------------------------

@pytest.fixture
def tiny_copy(tmp_path, tiny_llama_path):
    """A copy of tiny-llama in tmp_path, and a function that rewrites its weights."""
    dst = tmp_path / "tiny-llama"
    dst.mkdir()
    shutil.copy(tiny_llama_path / "config.json", dst / "config.json")
    shutil.copy(tiny_llama_path / "model.safetensors", dst / "model.safetensors")

    def edit(change) -> Path:
        state = load_file(dst / "model.safetensors")
        change(state)
        save_file(state, dst / "model.safetensors")
        return dst

    return dst, edit


def test_missing_fused_part_is_named(tiny_copy):
    _, edit = tiny_copy
    path = edit(lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(path)


def test_missing_plain_tensor_is_named(tiny_copy):
    _, edit = tiny_copy
    path = edit(lambda s: s.pop("model.layers.2.mlp.down_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.2\.mlp\.down_proj\.weight"):
        load_model(path)


def test_unexpected_tensor_is_named(tiny_copy):
    _, edit = tiny_copy
    path = edit(lambda s: s.update({"model.layers.0.mlp.extra_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(KeyError, match=r"model\.layers\.0\.mlp\.extra_proj\.weight"):
        load_model(path)


def test_shape_mismatch_names_tensor_and_both_shapes(tiny_copy):
    _, edit = tiny_copy
    path = edit(lambda s: s.update({"model.layers.0.self_attn.o_proj.weight": torch.zeros(128, 128)}))
    with pytest.raises(ValueError) as info:
        load_model(path)
    message = str(info.value)
    assert "model.layers.0.self_attn.o_proj.weight" in message
    assert "(128, 128)" in message and "(128, 256)" in message


def test_shape_mismatch_in_a_fused_part_names_that_part(tiny_copy):
    # k_proj with the wrong input size: q/k/v can no longer be concatenated. The error should
    # still say which checkpoint tensor is wrong, like every other loading error does.
    _, edit = tiny_copy
    path = edit(lambda s: s.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(128, 64)}))
    with pytest.raises(ValueError) as info:
        load_model(path)
    assert "model.layers.0.self_attn.k_proj.weight" in str(info.value)


def test_derived_rotary_inv_freq_is_ignored(tiny_copy, our_model):
    _, edit = tiny_copy
    path = edit(lambda s: s.update({
        f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(16) for i in range(4)}))
    config = ModelConfig.from_dir(path)
    state = read_checkpoint(path, config, torch.float32, torch.device("cpu"))
    assert not any("inv_freq" in name for name in state)
    model = load_model(path)
    reference = our_model(TINY_LLAMA)
    assert all(torch.equal(t, reference.state_dict()[n]) for n, t in model.state_dict().items())


def test_unknown_architecture_lists_the_known_ones(tiny_copy):
    path, _ = tiny_copy
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as info:
        load_model(path)
    message = str(info.value)
    assert "'MambaForCausalLM'" in message
    assert "LlamaForCausalLM" in message and "Qwen3ForCausalLM" in message


def test_missing_model_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_model(missing)


def test_directory_without_config_json_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as info:
        load_model(tmp_path)
    assert str(tmp_path) in str(info.value) and "config.json" in str(info.value)


def test_directory_without_safetensors_is_named(tiny_copy):
    path, _ = tiny_copy
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as info:
        load_model(path)
    assert str(path) in str(info.value) and "safetensors" in str(info.value)
