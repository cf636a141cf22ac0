"""Chapter 21's package part, minisgl.benchmark: the roofline cost model (parameters against
transformers, FLOPs against torch's FLOP counter, bytes by hand, decode buckets) and
perf.best_microseconds (its argument checks; on a GPU, a plain copy at a plausible bandwidth).
The example runs as a reader runs it. The stage-4 milestone (TP=2 with replayed decode graphs
gives TP=1's eager tokens) is test_cuda_graph.py's test_tp2_with_graphs_equals_tp1; the recorder
and the report (aggregation included) of benchmark/roofline.py are test_roofline.py's."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen3Config

from conftest import MODELS_DIR, SMOLLM2
from minisgl.benchmark.perf import best_microseconds
from minisgl.benchmark.roofline import Hardware, ModelShape, StepShape, decode_bucket, step_cost
from minisgl.models import ModelConfig
from processes import run_example

CHAPTER = 21  # tools/steps.py check runs this module on chapter 21's own tree

# head_dim 32 is not hidden / heads (16): the config's value must win, as in Qwen3-0.6B.
QWEN3 = dict(architectures=["Qwen3ForCausalLM"], hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             vocab_size=1000, rms_norm_eps=1e-6, tie_word_embeddings=False)
LLAMA = dict(architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
             num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
             vocab_size=500, rms_norm_eps=1e-5, tie_word_embeddings=True)


def shape_of(hf: dict) -> ModelShape:
    return ModelShape.of(ModelConfig.from_hf(hf))


def transformers_parameters(config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


# --- the cost model -----------------------------------------------------------------------------

@pytest.mark.parametrize("hf, config_class", [(QWEN3, Qwen3Config), (LLAMA, LlamaConfig)],
                         ids=["qwen3-untied", "llama-tied"])
def test_parameter_count_is_the_transformers_models(hf, config_class):
    assert shape_of(hf).parameters == transformers_parameters(config_class(**hf))


def test_parameters_and_step_costs_by_hand():
    shape = shape_of(QWEN3)
    # q 4×32 = 128 and k, v 2×32 = 64 wide: 64·(128 + 64 + 64) + o 128·64 + MLP 3·64·128
    assert shape.linear_params_per_layer == 16384 + 8192 + 24576 == 49152
    assert shape.norm_params_per_layer == 2 * 64 + 2 * 32  # two RMSNorms, q_norm and k_norm
    assert shape.weights_read_per_step == 2 * (49152 + 192) + 64 + 1000 * 64
    assert shape.parameters == shape.weights_read_per_step + 1000 * 64  # the embedding table
    assert shape.kv_per_token == 2 * 2 * 2 * 32  # layers × (K, V) × kv heads × head_dim
    llama = shape_of(LLAMA)
    assert llama.parameters == llama.weights_read_per_step  # tied: the LM head is the table

    # A decode step: two requests with 10 and 20 tokens cached, one new token each.
    step = StepShape.of("decode", [(10, 11), (20, 21)])
    assert step == StepShape("decode", requests=2, new_tokens=2, cached_tokens=30,
                             attention_pairs=11 + 21)
    cost = step_cost(shape, step, dtype_bytes=2)
    assert cost.weight_bytes == 2 * (shape.weights_read_per_step + 2 * 64)  # + 2 embedding rows
    assert cost.kv_bytes == 2 * 256 * (30 + 2)  # read 30 tokens' K/V, write 2
    assert cost.flops == 2 * 2 * 2 * 49152 + 2 * 2 * 1000 * 64 + 4 * 2 * 4 * 32 * 32

    hw = Hardware(bandwidth=1e9, peak_flops=1e12)
    assert cost.bound(hw) == max(cost.bytes / 1e9, cost.flops / 1e12) == cost.bytes / 1e9
    assert cost.memory_bound(hw)
    slow = Hardware(bandwidth=1e15, peak_flops=1e9)
    assert cost.bound(slow) == cost.flops / 1e9 and not cost.memory_bound(slow)


def test_embedding_rows_are_read_per_new_token():
    shape = shape_of(QWEN3)
    step = StepShape.of("prefill", [(0, 5), (2, 6)])  # two requests, 5 + 4 new tokens
    cost = step_cost(shape, step, dtype_bytes=2)
    assert cost.weight_bytes == 2 * (shape.weights_read_per_step + 9 * 64)


def test_a_tied_table_is_read_whole_by_the_lm_head_and_by_rows_for_the_embedding():
    llama = shape_of(LLAMA)
    step = StepShape.of("decode", [(10, 11), (20, 21)])
    cost = step_cost(llama, step, dtype_bytes=2)
    # weights_read_per_step holds the table once, for the LM head; the lookup reads 2 rows more
    assert cost.weight_bytes == 2 * (llama.weights_read_per_step + 2 * 64)


def test_attention_pairs_are_causal_among_the_new_tokens():
    # A chunk of 2 new tokens after 3 cached: they attend to 4 and 5 keys.
    assert StepShape.of("prefill", [(3, 5)]).attention_pairs == 4 + 5
    # A whole prompt of 4: 1 + 2 + 3 + 4; two requests add up.
    both = StepShape.of("prefill", [(0, 4), (3, 5)])
    assert (both.requests, both.new_tokens, both.cached_tokens, both.attention_pairs) == (
        2, 6, 3, 10 + 9)


def test_flops_are_what_torch_counts_in_the_transformers_forward():
    config = Qwen3Config(**QWEN3)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    shape, tokens = shape_of(QWEN3), 10
    ids = torch.randint(0, 1000, (1, tokens))
    with FlopCounterMode(display=False) as counter:
        model(ids, logits_to_keep=1)  # the LM head on the last token only, as our engine does
    # Eager attention multiplies the masked half of the prompt's square too; the bound counts
    # only the causal pairs.
    masked = 4 * shape.layers * shape.q_heads * shape.head_dim * tokens * (tokens - 1) // 2
    assert counter.get_total_flops() == masked + step_cost(
        shape, StepShape.of("prefill", [(0, tokens)]), 4).flops


def test_dense_models_only():
    moe = dict(QWEN3, architectures=["Qwen3MoeForCausalLM"], num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32)
    with pytest.raises(ValueError, match="dense"):
        shape_of(moe)


def test_decode_buckets():
    labels = {size: decode_bucket(size)[1] for size in (1, 2, 8, 9, 32, 33, 256, 257)}
    assert labels == {1: "1", 2: "2–8", 8: "2–8", 9: "9–32", 32: "9–32", 33: "33–64",
                      256: "129–256", 257: "257+"}


# --- perf.best_microseconds -------------------------------------------------------------------

@pytest.mark.parametrize("iters, rounds", [(0, 3), (10, 0)])
def test_best_microseconds_refuses_no_calls(iters, rounds):
    with pytest.raises(ValueError, match="at least 1"):
        best_microseconds(lambda: None, iters, rounds)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer is checked here")
def test_best_microseconds_says_it_needs_a_gpu():
    with pytest.raises(RuntimeError, match="needs a GPU"):
        best_microseconds(lambda: None, 10, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
def test_a_copy_times_in_the_right_units(graph):
    # 256 MiB read and 256 MiB written a call: about 0.1 ms on an H200, so the launch cost
    # (a few microseconds) hardly shows even eagerly.
    src = torch.randn(2**26, device="cuda")
    dst = torch.empty_like(src)
    seconds = best_microseconds(lambda: dst.copy_(src), iters=10, rounds=5, graph=graph) / 1e6
    bandwidth = 2 * src.numel() * src.element_size() / seconds
    assert torch.equal(dst, src)
    # A check of units, not a speed floor: microseconds mistaken for milliseconds, or the iters
    # not divided out, land orders of magnitude outside what any GPU's memory moves.
    assert 1e11 < bandwidth < 1e13


# --- the example ------------------------------------------------------------------------------

def test_example_prints_smollm2s_bound():
    out = run_example("ch21_benchmark.py")
    counted = transformers_parameters(AutoConfig.from_pretrained(MODELS_DIR / SMOLLM2))
    assert f"参数 {counted:,}，" in out
    batches = re.findall(r"^  batch +(\d+)：.*下界 +[\d,.]+ μs（访存），最多 +[\d,]+ token/s$",
                         out, re.M)
    assert batches == ["1", "8", "64", "256"]
