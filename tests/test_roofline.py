"""benchmark/roofline.py: the cost model (parameters against transformers, FLOPs against torch's
FLOP counter, bytes by hand), the recorder on tiny-qwen3 (every computed token in exactly one
step), and the report (table, JSON, replay from JSON, plot)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from minisgl.core import SamplingParams
from minisgl.models import ModelConfig

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-qwen3"


def _load():
    # roofline.py imports offline.py from beside it, as it does when run as a script.
    sys.path.insert(0, str(ROOT / "benchmark"))
    try:
        spec = importlib.util.spec_from_file_location("roofline_bench",
                                                      ROOT / "benchmark" / "roofline.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmark"))
    return module


roofline = _load()

# head_dim 32 is not hidden / heads (16): the config's value must win, as in Qwen3-0.6B.
QWEN3 = dict(architectures=["Qwen3ForCausalLM"], hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             vocab_size=1000, rms_norm_eps=1e-6, tie_word_embeddings=False)
LLAMA = dict(architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
             num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
             vocab_size=500, rms_norm_eps=1e-5, tie_word_embeddings=True)


def shape_of(hf: dict) -> roofline.ModelShape:
    return roofline.ModelShape.of(ModelConfig.from_hf(hf))


# ----------------------------------------------------------------------------------------------
# Cost model


@pytest.mark.parametrize("hf, config_class", [(QWEN3, Qwen3Config), (LLAMA, LlamaConfig)],
                         ids=["qwen3-untied", "llama-tied"])
def test_parameter_count_is_the_transformers_models(hf, config_class):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_class(**hf))
    assert shape_of(hf).parameters == sum(p.numel() for p in model.parameters())


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
    step = roofline.StepShape.of("decode", [(10, 11), (20, 21)])
    assert step == roofline.StepShape("decode", requests=2, new_tokens=2, cached_tokens=30,
                                      attention_pairs=11 + 21)
    cost = roofline.step_cost(shape, step, dtype_bytes=2)
    assert cost.weight_bytes == 2 * (shape.weights_read_per_step + 2 * 64)  # + 2 embedding rows
    assert cost.kv_bytes == 2 * 256 * (30 + 2)  # read 30 tokens' K/V, write 2
    assert cost.flops == 2 * 2 * 2 * 49152 + 2 * 2 * 1000 * 64 + 4 * 2 * 4 * 32 * 32

    hw = roofline.Hardware(bandwidth=1e9, peak_flops=1e12)
    assert cost.bound(hw) == max(cost.bytes / 1e9, cost.flops / 1e12) == cost.bytes / 1e9
    slow = roofline.Hardware(bandwidth=1e15, peak_flops=1e9)
    assert cost.bound(slow) == cost.flops / 1e9


def test_attention_pairs_are_causal_among_the_new_tokens():
    # A chunk of 2 new tokens after 3 cached: they attend to 4 and 5 keys.
    assert roofline.StepShape.of("prefill", [(3, 5)]).attention_pairs == 4 + 5
    # A whole prompt of 4: 1 + 2 + 3 + 4; two requests add up.
    both = roofline.StepShape.of("prefill", [(0, 4), (3, 5)])
    assert (both.requests, both.new_tokens, both.cached_tokens, both.attention_pairs) == (
        2, 6, 3, 10 + 9)


def test_flops_are_what_torch_counts_in_the_transformers_forward():
    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    shape, tokens = shape_of(QWEN3), 10
    ids = torch.randint(0, 1000, (1, tokens))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids, logits_to_keep=1)  # the LM head on the last token only, as our engine does
    # Eager attention multiplies the masked half of the prompt's square too; the bound counts
    # only the causal pairs.
    masked = 4 * shape.layers * shape.q_heads * shape.head_dim * tokens * (tokens - 1) // 2
    assert counter.get_total_flops() == masked + roofline.step_cost(
        shape, roofline.StepShape.of("prefill", [(0, tokens)]), 4).flops


def test_dense_models_only():
    moe = dict(QWEN3, architectures=["Qwen3MoeForCausalLM"], num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32)
    with pytest.raises(ValueError, match="dense"):
        shape_of(moe)


def test_decode_buckets():
    labels = {size: roofline.decode_bucket(size)[1] for size in (1, 2, 8, 9, 32, 33, 256, 257)}
    assert labels == {1: "1", 2: "2–8", 8: "2–8", 9: "9–32", 32: "9–32", 33: "33–64",
                      256: "129–256", 257: "257+"}


# ----------------------------------------------------------------------------------------------
# Recorder


def test_recorder_sees_every_computed_token_once():
    llm = roofline.LLM(str(TINY), dtype=torch.float32, device="cpu", max_running_req=4,
                       num_page_override=1024, max_seq_len_override=256, page_size=1)
    # Different first tokens: no request can reuse another's prefix from the radix cache.
    prompts = [[100 + i] + list(range(200, 200 + n)) for i, n in enumerate((12, 30, 7, 20))]
    outputs = (3, 7, 1, 5)
    try:
        engine = llm.backend.scheduler.engine
        recording = roofline.record(llm, prompts, [SamplingParams(max_tokens=n, ignore_eos=True)
                                                   for n in outputs])
        assert "launch" not in vars(engine)  # the wrapper is gone
    finally:
        llm.shutdown()
    prefill, *decodes = recording.steps
    # One prefill computes every prompt token and samples each request's first output...
    assert prefill == roofline.StepShape.of("prefill", [(0, len(p)) for p in prompts])
    # ...then decode step j runs every request that still owes a token after j outputs: with
    # overlap, a request leaves the batch as soon as its last token is launched.
    assert all(s.phase == "decode" and s.new_tokens == s.requests for s in decodes)
    assert [s.requests for s in decodes] == [sum(n - 1 >= j for n in outputs)
                                             for j in range(1, max(outputs))] == [3, 3, 2, 2, 1, 1]
    assert sum(s.new_tokens for s in recording.steps) == (sum(map(len, prompts))
                                                          + sum(n - 1 for n in outputs))
    # Decode step j reads the prompt and the j - 1 outputs computed before it.
    assert sum(s.cached_tokens for s in decodes) == sum(
        len(p) + j - 1 for p, n in zip(prompts, outputs) for j in range(1, n))
    assert len(recording.seconds) == len(recording.steps)
    assert all(s > 0 for s in recording.seconds)
    assert sum(recording.seconds) <= recording.wall_seconds


# ----------------------------------------------------------------------------------------------
# Report


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("roofline") / "run.json"
    out = io.StringIO()  # capsys is per test; this run serves the module
    with contextlib.redirect_stdout(out):
        assert roofline.main(["--model", str(TINY), "--device", "cpu", "--num-requests", "3",
                              "--json", str(path)]) == 0
    return path, out.getvalue()


def test_table_and_json(saved_run):
    path, printed = saved_run
    assert "3 个请求" in printed and "实测/下界" in printed
    assert "prefill" in printed and "decode，批 1" in printed
    data = json.loads(path.read_text())
    assert {"workload", "model", "device", "dtype", "prompt_tokens", "output_tokens", "shape",
            "dtype_bytes", "hardware", "parameters", "weight_bytes_per_step",
            "kv_bytes_per_token", "wall_s", "steps_measured_s", "phases", "steps"} <= set(data)
    assert data["workload"] == "small" and data["dtype"] == "float32"
    hw = data["hardware"]
    for step in data["steps"]:
        bytes_ = step["weight_bytes"] + step["kv_bytes"]
        assert step["bound_s"] == max(bytes_ / hw["bandwidth"], step["flops"] / hw["peak_flops"])
        assert step["bound_s"] > 0 and step["measured_s"] > 0
    phases = data["phases"]
    assert phases[0]["phase"] == "prefill"
    assert sum(p["steps"] for p in phases) == len(data["steps"])
    assert sum(p["tokens"] for p in phases) == sum(s["new_tokens"] for s in data["steps"])
    assert sum(p["measured_s"] for p in phases) == pytest.approx(data["steps_measured_s"])
    # Each request's decode steps: all its outputs but the one its prefill sampled.
    decode_tokens = sum(s["new_tokens"] for s in data["steps"] if s["phase"] == "decode")
    assert decode_tokens == sum(n - 1 for n in data["output_tokens"])


def test_replay_from_json_with_other_hardware(saved_run, tmp_path, capsys):
    path, _ = saved_run
    again = tmp_path / "again.json"
    first = json.loads(path.read_text())
    bandwidth, peak = first["hardware"]["bandwidth"] / 2, first["hardware"]["peak_flops"] / 2
    assert roofline.main(["--from-json", str(path), "--bandwidth", str(bandwidth),
                          "--peak-flops", str(peak), "--json", str(again)]) == 0
    assert "实测/下界" in capsys.readouterr().out
    second = json.loads(again.read_text())
    assert [s["measured_s"] for s in second["steps"]] == [s["measured_s"] for s in first["steps"]]
    assert [s["bound_s"] for s in second["steps"]] == pytest.approx(
        [2 * s["bound_s"] for s in first["steps"]])


def test_plot(saved_run, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    assert roofline.main(["--from-json", str(saved_run[0]), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so_and_reports_the_rest(saved_run, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "roofline.png"
    assert roofline.main(["--from-json", str(saved_run[0]), "--plot", str(png)]) == 1
    printed = capsys.readouterr()
    assert "matplotlib" in printed.err and len(printed.err.strip().splitlines()) == 1
    assert "实测/下界" in printed.out
    assert not png.exists()
