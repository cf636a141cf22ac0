"""Chapter 20: Qwen3-MoE on the model side — config, the MoE layer, weight loading, and tokens.

- tiny-qwen3-moe (8 experts, top-2, renormalised; layer 1 of 4 dense) gives transformers'
  float32 greedy tokens with the torch MoE backend, and the same tokens at TP=2 over gloo.
- The MoE layer equals transformers' Qwen3MoeSparseMoeBlock on the same weights; the loader's
  stacked w13 / w2 are transformers' own gate_up_proj / down_proj.
- Which layers have experts follows transformers' rule (mlp_only_layers, decoder_sparse_step).
- Sharded loading: each TP rank holds its slice of every expert, the router whole.
- Errors: a missing expert, an expert of the wrong shape, an expert beyond num_experts, a
  moe_intermediate_size that does not divide, and the MoE variants not implemented here.
"""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from conftest import (MODELS_DIR, TINY_QWEN3, TINY_QWEN3_MOE, as_tp_rank, greedy_by_tp, load_as,
                      load_error)
from minisgl.core import Context, SamplingParams, set_global_ctx
from minisgl.layers import MoE
from minisgl.models import ModelConfig, create_model, load_model
from minisgl.moe import TorchMoEBackend
from processes import run_example

CHAPTER = 20  # tools/steps.py check runs this module on chapter 20's own tree

PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
OPTIONS = dict(max_running_req=4, num_page_override=512, max_seq_len_override=128,
               moe_backend="torch")
E, K, I, H = 8, 2, 32, 128  # tiny-qwen3-moe: experts, top_k, moe_intermediate_size, hidden


# --- tokens against transformers, TP=1 and TP=2 -------------------------------------------------

@pytest.fixture(scope="module")
def runs(hf_model, hf_tokenizer, hf_greedy) -> dict:
    """16 greedy tokens for every prompt: transformers', and ours at TP=1 and TP=2 (one
    generate over all four prompts, so the experts see batches of several requests)."""
    prompts = [hf_tokenizer(TINY_QWEN3_MOE)(p).input_ids for p in PROMPTS]
    hf = hf_model(TINY_QWEN3_MOE)
    return {"hf": [hf_greedy(hf, ids, GREEDY.max_tokens) for ids in prompts],
            **greedy_by_tp(MODELS_DIR / TINY_QWEN3_MOE, prompts, GREEDY, OPTIONS)}


def test_tiny_qwen3_moe_greedy_equals_transformers(runs):
    assert all(len(ids) == GREEDY.max_tokens for ids in runs["hf"])
    assert runs[1] == runs["hf"]


def test_tiny_qwen3_moe_tp2_equals_tp1(runs):
    # Each rank runs its half of every expert's intermediate dimension; one all-reduce a layer.
    assert runs[2] == runs[1]


# --- the layer against transformers' block ------------------------------------------------------

@pytest.fixture
def torch_moe_ctx():
    # The layer reads only the MoE backend from the Context; no attention runs here.
    set_global_ctx(Context(attn_backend=None, moe_backend=TorchMoEBackend()))  # type: ignore
    yield
    set_global_ctx(None)


def test_moe_layer_equals_transformers_sparse_block(hf_model, torch_moe_ctx):
    block = hf_model(TINY_QWEN3_MOE).model.layers[0].mlp
    layer = MoE(H, E, K, I, renormalize=True)
    layer.load_state_dict({"gate.weight": block.gate.weight,
                           "experts.w13": block.experts.gate_up_proj,
                           "experts.w2": block.experts.down_proj})
    x = torch.randn(1, 7, H)
    torch.testing.assert_close(layer.forward(x[0]), block(x)[0], atol=1e-5, rtol=1e-5)


def test_loaded_experts_are_transformers_stacked_weights(hf_model, our_model):
    hf, ours = hf_model(TINY_QWEN3_MOE), our_model(TINY_QWEN3_MOE)
    for i in (0, 2, 3):
        block, mlp = hf.model.layers[i].mlp, ours.model.layers[i].mlp
        assert torch.equal(mlp.experts.w13, block.experts.gate_up_proj)  # gate rows, then up
        assert torch.equal(mlp.experts.w2, block.experts.down_proj)
        assert torch.equal(mlp.gate.weight, block.gate.weight)


# --- config: experts and which layers have them -------------------------------------------------

def test_config_of_tiny_qwen3_moe():
    c = ModelConfig.from_dir(MODELS_DIR / TINY_QWEN3_MOE)  # transformers 5: num_local_experts
    assert c.architecture == "Qwen3MoeForCausalLM"
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (E, K, I)
    assert c.norm_topk_prob is True and c.intermediate_size == 256
    assert (c.decoder_sparse_step, c.mlp_only_layers) == (1, (1,))
    assert [c.is_moe_layer(i) for i in range(4)] == [True, False, True, True]


def moe_hf_config(**extra) -> dict:
    """A Qwen3-MoE config.json as Qwen's own checkpoints spell it (num_experts)."""
    return {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 100, "rms_norm_eps": 1e-6, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], **extra}


def test_config_reads_qwens_own_num_experts_field():
    c = ModelConfig.from_hf(moe_hf_config())
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, 32)


def test_dense_config_has_no_experts():
    c = ModelConfig.from_dir(MODELS_DIR / TINY_QWEN3)
    assert (c.num_experts, c.num_experts_per_tok, c.mlp_only_layers) == (0, 0, ())
    assert not any(c.is_moe_layer(i) for i in range(c.num_layers))


@pytest.mark.parametrize("layers, step, mlp_only, experts", [
    (4, 2, [], 4),        # every second layer: 1, 3
    (4, 1, [0, 3], 4),    # all but the listed: 1, 2
    (6, 2, [3], 4),       # both rules: 1, 5
    (6, 3, [], 4),        # 2, 5
    (4, 1, [], 0),        # no experts at all: every layer dense
])
def test_dense_or_sparse_layers_follow_transformers(layers, step, mlp_only, experts):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    hf_config = Qwen3MoeConfig(
        num_hidden_layers=layers, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=100, num_experts=experts,
        num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=step,
        mlp_only_layers=mlp_only)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_config)
        ours = create_model(ModelConfig.from_hf(
            {**hf_config.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}))
    hf_sparse = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]
    assert [isinstance(layer.mlp, MoE) for layer in ours.model.layers] == hf_sparse
    assert any(hf_sparse) == bool(experts)


# --- sharded loading ----------------------------------------------------------------------------

def test_each_rank_holds_its_slice_of_every_expert_and_the_whole_router():
    path = MODELS_DIR / TINY_QWEN3_MOE
    checkpoint = load_file(path / "model.safetensors")
    n = I // 2
    for rank in (0, 1):
        mlp = load_as(path, rank, 2).model.layers[2].mlp
        assert mlp.experts.w13.shape == (E, 2 * n, H) and mlp.experts.w2.shape == (E, H, n)
        assert torch.equal(mlp.gate.weight, checkpoint["model.layers.2.mlp.gate.weight"])
        rows = slice(rank * n, (rank + 1) * n)
        for e in range(E):
            expert = f"model.layers.2.mlp.experts.{e}"
            assert torch.equal(mlp.experts.w13[e], torch.cat(
                [checkpoint[f"{expert}.gate_proj.weight"][rows],
                 checkpoint[f"{expert}.up_proj.weight"][rows]]))
            assert torch.equal(mlp.experts.w2[e], checkpoint[f"{expert}.down_proj.weight"][:, rows])


def test_moe_intermediate_size_that_does_not_divide_is_refused():
    config = ModelConfig.from_hf(moe_hf_config(moe_intermediate_size=30))  # heads divide by 4
    with as_tp_rank(0, 4):
        with pytest.raises(ValueError, match=r"moe_intermediate_size \(30\).*TP size 4"):
            with torch.device("meta"):
                create_model(config)


# --- loading errors on an edited copy of tiny-qwen3-moe ----------------------------------------

def test_missing_expert_is_named(model_copy):
    path = model_copy(TINY_QWEN3_MOE,
                      lambda s: s.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"):
        load_model(path)


def test_expert_shape_mismatch_names_tensor_and_both_shapes(model_copy):
    path = model_copy(TINY_QWEN3_MOE, lambda s: s.update(
        {"model.layers.3.mlp.experts.6.down_proj.weight": torch.zeros(H, 16)}))
    message = load_error(path)
    assert "model.layers.3.mlp.experts.6.down_proj.weight" in message
    assert "(128, 16)" in message and "(128, 32)" in message


def test_expert_beyond_num_experts_is_named(model_copy):
    path = model_copy(TINY_QWEN3_MOE, lambda s: s.update(
        {"model.layers.0.mlp.experts.8.gate_proj.weight": torch.zeros(I, H)}))
    with pytest.raises(KeyError, match=r"experts\.8\.gate_proj\.weight.*num_experts=8"):
        load_model(path)


# --- variants that are refused --------------------------------------------------------------------

@pytest.mark.parametrize("extra, match", [
    (dict(num_experts_per_tok=5), r"num_experts_per_tok=5.*num_experts=4"),
    (dict(num_experts_per_tok=0), r"num_experts_per_tok=0"),
    (dict(shared_expert_intermediate_size=256), r"shared_expert_intermediate_size=256"),
    (dict(n_shared_experts=1), r"n_shared_experts=1"),
    (dict(decoder_sparse_step=0), r"decoder_sparse_step=0"),
    (dict(moe_intermediate_size=0), r"moe_intermediate_size=0"),
])
def test_unsupported_moe_variants_are_refused_by_name(extra, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(moe_hf_config(**extra))


def test_qwen2_moe_config_is_refused_for_its_shared_expert():
    from transformers import Qwen2MoeConfig

    hf = Qwen2MoeConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=100).to_dict()
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        ModelConfig.from_hf({**hf, "architectures": ["Qwen2MoeForCausalLM"]})



@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answers are checked here")
def test_example_gives_transformers_text_with_both_backends(hf_example_text):
    out = run_example("ch20_moe.py")
    assert re.search(r"^两种后端输出相同： True$", out, re.M)
    assert f"--moe triton → {hf_example_text(TINY_QWEN3_MOE, 8)!r}" in out
