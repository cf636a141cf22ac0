"""layers: each operator against its transformers counterpart on real weights, RoPE (default,
llama3, yarn) against transformers far beyond position 1,000, and BaseOP's naming and loading."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import SMOLLM2, TINY_LLAMA, TINY_QWEN3
from minisgl.layers import (BaseOP, Embedding, FusedAddRMSNorm, Linear, LMHead, MergedLinear,
                            OPList, QKVLinear, RMSNorm, RotaryEmbedding, SiluAndMul)

CHAPTER = 2  # tools/steps.py check runs this module on chapter 2's own tree

ATOL = 1e-5


@pytest.fixture(scope="module")
def smol(hf_model):
    return hf_model(SMOLLM2)


def hidden(n: int, size: int) -> torch.Tensor:
    return torch.randn(n, size) * 2.0


# --- each layer against transformers on SmolLM2's weights ----------------------------------------

def test_embedding_matches_hf_embed_tokens(smol):
    emb = Embedding(*smol.model.embed_tokens.weight.shape)
    emb.load_state_dict({"weight": smol.model.embed_tokens.weight})
    ids = torch.tensor([0, 1, 17, 4000, 49151])
    assert torch.equal(emb.forward(ids), smol.model.embed_tokens(ids))


def test_rmsnorm_matches_hf_rmsnorm(smol):
    theirs = smol.model.layers[3].input_layernorm
    ours = RMSNorm(576, theirs.variance_epsilon)
    ours.load_state_dict({"weight": theirs.weight})
    x = hidden(7, 576)
    torch.testing.assert_close(ours.forward(x), theirs(x), atol=ATOL, rtol=1e-5)


def test_fused_add_rmsnorm_returns_normed_sum_and_the_sum(smol):
    theirs = smol.model.layers[3].post_attention_layernorm
    ours = FusedAddRMSNorm(576, theirs.variance_epsilon)
    ours.load_state_dict({"weight": theirs.weight})
    x, residual = hidden(7, 576), hidden(7, 576)
    total = x + residual
    normed, new_residual = ours.forward(x.clone(), residual.clone())
    torch.testing.assert_close(new_residual, total, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(normed, theirs(total), atol=ATOL, rtol=1e-5)


def test_fused_add_rmsnorm_without_residual_starts_the_stream(smol):
    theirs = smol.model.layers[0].input_layernorm
    ours = FusedAddRMSNorm(576, theirs.variance_epsilon)
    ours.load_state_dict({"weight": theirs.weight})
    x = hidden(5, 576)
    normed, residual = ours.forward(x.clone())
    torch.testing.assert_close(normed, theirs(x), atol=ATOL, rtol=1e-5)
    assert torch.equal(residual, x)


def test_qkv_linear_matches_hf_q_k_v_proj(smol):
    attn = smol.model.layers[2].self_attn
    qkv = QKVLinear(576, num_q_heads=9, num_kv_heads=3, head_dim=64)
    qkv.load_state_dict({"weight": torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                              attn.v_proj.weight])})
    x = hidden(6, 576)
    q, k, v = qkv.forward(x).split([9 * 64, 3 * 64, 3 * 64], dim=-1)
    torch.testing.assert_close(q, attn.q_proj(x), atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(k, attn.k_proj(x), atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(v, attn.v_proj(x), atol=ATOL, rtol=1e-5)


def test_merged_linear_silu_and_mul_linear_match_hf_llama_mlp(smol):
    mlp = smol.model.layers[4].mlp
    gate_up, act, down = MergedLinear(576, [1536, 1536]), SiluAndMul(), Linear(1536, 576)
    gate_up.load_state_dict({"weight": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])})
    down.load_state_dict({"weight": mlp.down_proj.weight})
    x = hidden(6, 576)
    ours = down.forward(act.forward(gate_up.forward(x)))
    torch.testing.assert_close(ours, mlp(x), atol=1e-4, rtol=1e-5)


def test_lm_head_tied_to_embedding_matches_hf_lm_head(smol):
    emb = Embedding(49152, 576)
    emb.load_state_dict({"weight": smol.model.embed_tokens.weight})
    head = LMHead(49152, 576, tied_embedding=emb)
    x = hidden(3, 576)
    torch.testing.assert_close(head.forward(x), smol.lm_head(x), atol=1e-4, rtol=1e-5)


def test_tied_lm_head_declares_no_weight_of_its_own():
    head = LMHead(10, 4, tied_embedding=Embedding(10, 4))
    assert head.state_dict() == {}


def test_untied_lm_head_uses_its_own_weight():
    head = LMHead(10, 4)
    weight = torch.randn(10, 4)
    head.load_state_dict({"weight": weight})
    x = torch.randn(2, 4)
    torch.testing.assert_close(head.forward(x), x @ weight.T)


def test_rmsnorm_per_head_matches_qwen3_q_norm(hf_model):
    theirs = hf_model(TINY_QWEN3).model.layers[1].self_attn.q_norm
    ours = RMSNorm(32, theirs.variance_epsilon)
    ours.load_state_dict({"weight": theirs.weight})
    x = hidden(5 * 8, 32).view(5, 8, 32)  # [tokens, q heads, head_dim]
    torch.testing.assert_close(ours.forward(x), theirs(x), atol=ATOL, rtol=1e-5)


# --- rotary embedding against transformers beyond position 1,000 -------------------------------

def positions_up_to_4000() -> torch.Tensor:
    return torch.cat([torch.tensor([0, 1, 2, 511, 1000, 1023, 1024, 2047, 3999]),
                      torch.randint(1000, 4000, (23,))])


def rotate_with_hf(rotary_module, apply_fn, positions, q, k):
    """q: [tokens, q_heads, head_dim] -> transformers' rotated q and k (same layout)."""
    cos, sin = rotary_module(q, positions[None])  # [1, tokens, head_dim]
    q_hf, k_hf = apply_fn(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return q_hf[0].transpose(0, 1), k_hf[0].transpose(0, 1)


def rotate_with_ours(rotary: RotaryEmbedding, positions, q, k):
    q_flat, k_flat = q.reshape(len(positions), -1).clone(), k.reshape(len(positions), -1).clone()
    q_out, k_out = rotary.forward(positions, q_flat, k_flat)
    return q_out.view_as(q), k_out.view_as(k)


def rope_params(path) -> tuple[float, dict | None]:
    rope = dict(json.loads((path / "config.json").read_text())["rope_parameters"])
    theta = rope.pop("rope_theta")
    return theta, (rope if rope["rope_type"] != "default" else None)


@pytest.mark.parametrize("name, rope_type, q_heads, kv_heads, head_dim", [
    (SMOLLM2, None, 9, 3, 64), (TINY_LLAMA, "llama3", 8, 4, 32)])
def test_rope_matches_hf_beyond_position_1000(hf_model, models_dir, name, rope_type, q_heads,
                                              kv_heads, head_dim):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    theta, scaling = rope_params(models_dir / name)
    assert (scaling or {}).get("rope_type") == rope_type
    ours = RotaryEmbedding(head_dim, 4096, theta, scaling)
    positions = positions_up_to_4000()
    q = torch.randn(len(positions), q_heads, head_dim)
    k = torch.randn(len(positions), kv_heads, head_dim)
    expected = rotate_with_hf(hf_model(name).model.rotary_emb, apply_rotary_pos_emb,
                              positions, q, k)
    for got, want in zip(rotate_with_ours(ours, positions, q, k), expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_yarn_rope_matches_hf_qwen3_beyond_position_1000():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import (Qwen3RotaryEmbedding,
                                                          apply_rotary_pos_emb)

    # transformers 5 takes rope_theta and the scaling together in rope_parameters.
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
            "rope_theta": 1e6}
    config = Qwen3Config(hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=64, max_position_embeddings=4096, rope_parameters=dict(rope))
    theirs = Qwen3RotaryEmbedding(config)
    assert theirs.attention_scaling != 1.0  # yarn really is in effect
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    ours = RotaryEmbedding(64, 4096, 1e6, scaling)
    positions = positions_up_to_4000()
    q, k = torch.randn(len(positions), 8, 64), torch.randn(len(positions), 4, 64)
    expected = rotate_with_hf(theirs, apply_rotary_pos_emb, positions, q, k)
    for got, want in zip(rotate_with_ours(ours, positions, q, k), expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rope_rotates_query_and_key_in_place():
    rotary = RotaryEmbedding(8, 64, 10000.0)
    q, k = torch.randn(3, 16), torch.randn(3, 8)
    q_out, k_out = rotary.forward(torch.tensor([5, 6, 7]), q, k)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()


def test_rope_unknown_type_raises_naming_it():
    with pytest.raises(ValueError, match="'dynamic'"):
        RotaryEmbedding(8, 64, 10000.0, {"rope_type": "dynamic", "factor": 2.0})


def test_rope_table_is_not_a_parameter():
    assert RotaryEmbedding(8, 64, 10000.0).state_dict() == {}


# --- BaseOP: names, loading, meta ----------------------------------------------------------------

class Block(BaseOP):
    def __init__(self) -> None:
        self.norm = RMSNorm(4, 1e-6)
        self.proj = Linear(4, 3, bias=True)
        self.act = SiluAndMul()
        self._private = Linear(4, 4)  # not a child: its weight is not ours
        self.scale = torch.ones(2)  # a public tensor attribute is a parameter


class Net(BaseOP):
    def __init__(self) -> None:
        self.embed = Embedding(10, 4)
        self.layers = OPList([Block(), Block()])


def full_state(net: BaseOP) -> dict[str, torch.Tensor]:
    return {name: torch.randn(tensor.shape) for name, tensor in net.state_dict().items()}


def test_state_dict_names_are_dotted_attribute_paths():
    assert sorted(Net().state_dict()) == sorted([
        "embed.weight",
        *(f"layers.{i}.{name}" for i in range(2)
          for name in ["norm.weight", "proj.weight", "proj.bias", "scale"]),
    ])


def test_linear_without_bias_declares_only_weight():
    assert list(Linear(4, 3).state_dict()) == ["weight"]


def test_stateless_ops_declare_nothing():
    assert SiluAndMul().state_dict() == {}


def test_load_state_dict_sets_every_parameter_by_name():
    net, state = Net(), full_state(Net())
    net.load_state_dict(state)
    assert net.layers[1].proj.bias is state["layers.1.proj.bias"]
    assert all(net.state_dict()[name] is tensor for name, tensor in state.items())


def test_load_state_dict_missing_tensor_is_named():
    net, state = Net(), full_state(Net())
    del state["layers.1.norm.weight"]
    with pytest.raises(KeyError, match=r"missing .*layers\.1\.norm\.weight"):
        net.load_state_dict(state)


def test_load_state_dict_unexpected_tensor_is_named():
    net, state = Net(), full_state(Net())
    state["layers.0.extra.weight"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"unexpected .*layers\.0\.extra\.weight"):
        net.load_state_dict(state)


def test_load_state_dict_shape_mismatch_names_tensor_and_both_shapes():
    net, state = Net(), full_state(Net())
    state["layers.0.proj.weight"] = torch.zeros(3, 5)
    with pytest.raises(ValueError) as info:
        net.load_state_dict(state)
    message = str(info.value)
    assert "layers.0.proj.weight" in message and "(3, 5)" in message and "(3, 4)" in message


def test_failed_load_changes_nothing():
    net, state = Net(), full_state(Net())
    before = net.state_dict()
    state["layers.0.proj.weight"] = torch.zeros(3, 5)
    with pytest.raises(ValueError):
        net.load_state_dict(state)
    assert all(net.state_dict()[name] is tensor for name, tensor in before.items())
    assert net.embed.weight.is_meta


def test_unloaded_parameter_stays_on_meta():
    layer = Linear(4, 3)
    assert layer.weight.is_meta and layer.weight.shape == (3, 4)
    norm = RMSNorm(4, 1e-6)
    norm.load_state_dict({"weight": torch.ones(4)})
    assert not norm.weight.is_meta and Linear(4, 3).weight.device.type == "meta"


# --- the chapter's example ---

import ast  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_names_slots_reports_load_errors_and_rotates():
    out = run_example("ch02_layers.py")
    # OPList of two Blocks (RMSNorm(8) as `norm`, MergedLinear(8, [16, 16]) as `gate_up_proj`):
    # names are attribute paths, slots have the shapes but live on meta.
    for i in range(2):
        assert re.search(rf"^{i}\.norm\.weight +\(8,\) +device=meta$", out, re.M)
        assert re.search(rf"^{i}\.gate_up_proj\.weight +\(32, 8\) +device=meta$", out, re.M)
    assert ("少一个张量: KeyError: \"checkpoint is missing 1 tensor(s), e.g. ['1.norm.weight']\""
            in out)
    assert ("多一个张量: KeyError: \"checkpoint has 1 unexpected tensor(s), e.g. "
            "['2.norm.weight']\"" in out)
    shape_line = re.search(r"^形状不对: ValueError: (.*)$", out, re.M).group(1)
    assert "'0.norm.weight'" in shape_line and "(9,)" in shape_line and "(8,)" in shape_line
    assert "加载成功后 0.norm.weight 在 cpu" in out
    # RoPE by hand (rotate-half, head_dim 4, base 10000): a vector of ones at position p becomes
    # [cos - sin, cos + sin] per frequency 1 / 10000^(2i/4).
    rows = {int(p): ast.literal_eval(r) for p, r in re.findall(r"位置 (\d)：(\[.*\])", out)}
    assert sorted(rows) == [0, 1, 2]
    for p, row in rows.items():
        angles = [p / 10000.0 ** (2 * i / 4) for i in range(2)]
        expected = ([math.cos(a) - math.sin(a) for a in angles]
                    + [math.cos(a) + math.sin(a) for a in angles])
        assert row == pytest.approx(expected, abs=1e-4)
