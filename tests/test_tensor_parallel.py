"""Chapter 16: tensor parallelism on the CPU, with real processes talking over gloo.

- Outputs: LLM(tp_size=N) gives the same token ids as tp_size=1 — tiny-qwen3 at TP=2,
  tiny-llama at TP=4 (greedy, and seeded sampling of all four prompts in one call), SmolLM2 at
  TP=3; tiny-qwen2 (q/k/v biases, sharded with their rows) and tiny-mistral give transformers'
  16 greedy tokens at TP=1 and TP=2.
- Sharded loading, in this process (set_tp_info, then load_model): each rank's shapes, and the
  ranks' shards put back together are exactly the checkpoint's tensors; no rank reads a
  sharded tensor whole; a vocabulary that does not divide is padded with zero rows.
- A spawned gloo group of 3: the collectives, a vocab-parallel Embedding and LMHead equal to
  the unsharded ones; a group of 2 building Engines: local KV heads, num_pages = min over ranks.
- Start-up: head counts that do not divide fail before any process starts (LLM and
  `python -m minisgl`); a rank that dies while loading is named, and nothing is left running.
- The server with --tp 2 answers like TP=1 and stops cleanly; CPU threads = cores // TP.

Every LLM or server with TP > 1 is started once per module (module-scoped fixtures): on a
2-core machine each start costs several seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import minisgl.utils.device as device_module
from conftest import (MODELS_DIR, ROOT, SMOLLM2, TINY_LLAMA, TINY_MISTRAL, TINY_QWEN2, TINY_QWEN3,
                      as_tp_rank, greedy_by_tp, load_as, reference_cpu_threads)
from minisgl.core import SamplingParams
from minisgl.distributed import TPInfo, destroy_distributed, get_comm, get_tp_info, init_distributed
from minisgl.layers import Embedding, LMHead, vocab_shard
from minisgl.utils import configure_threads
from minisgl.utils.process import rendezvous_address
from minisgl.utils.zmq_queue import new_run_id
from processes import (START_TIMEOUT, Child, descendants_of, minisgl_env, model_that_never_loads,
                       wait_all_gone, workers_of)

CHAPTER = 16  # tools/steps.py check runs this module on chapter 16's own tree

PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the"]
OPTIONS = dict(max_running_req=4, num_page_override=512, max_seq_len_override=128)
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
# top_k/top_p filter too, so the sampled path is the full one.
SAMPLED = SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, top_k=200, top_p=0.95)


# ----------------------------------------------------------------------------------------------
# LLM runs: each (model, TP) is started once, runs everything its tests compare, and stops.


def llm_runs(model: str, tp: int, prompts: list[str], greedy: SamplingParams,
             sampled: bool) -> dict[str, list[list[int]]]:
    """Token ids of one greedy generate over all `prompts`; with `sampled`, also one sampled
    generate over all of them (LLM sends a call's requests as one message, so rank 0 takes
    them into the same step as the in-process scheduler does: the batches — and with them
    the order in which the seeded generator is drawn from — are the same at any TP size)."""
    from minisgl.llm import LLM

    llm = LLM(str(MODELS_DIR / model), dtype=torch.float32, tp_size=tp, **OPTIONS)
    try:
        runs = {"greedy": [o["token_ids"] for o in llm.generate(prompts, greedy)]}
        if sampled:
            runs["sampled"] = [o["token_ids"] for o in llm.generate(prompts, SAMPLED)]
        runs["text"] = [llm.tokenizer.decode(ids) for ids in runs["greedy"]]
    finally:
        llm.shutdown()
    return runs


@pytest.fixture(scope="module")
def qwen3() -> dict[int, dict]:
    return {tp: llm_runs(TINY_QWEN3, tp, PROMPTS, GREEDY, sampled=True) for tp in (1, 2)}


@pytest.fixture(scope="module")
def llama() -> dict[int, dict]:
    return {tp: llm_runs(TINY_LLAMA, tp, PROMPTS, GREEDY, sampled=True) for tp in (1, 4)}


@pytest.fixture(scope="module")
def smollm2() -> dict[int, dict]:
    short = SamplingParams(max_tokens=8, ignore_eos=True)
    return {tp: llm_runs(SMOLLM2, tp, PROMPTS[:2], short, sampled=False) for tp in (1, 3)}


def test_tiny_qwen3_tp2_greedy_equals_tp1(qwen3):
    assert all(len(ids) == GREEDY.max_tokens for ids in qwen3[2]["greedy"])
    assert qwen3[2]["greedy"] == qwen3[1]["greedy"]


def test_tiny_llama_tp4_greedy_equals_tp1(llama):
    # Four ranks of one KV head each; the tied LM head reuses each rank's embedding rows.
    assert all(len(ids) == GREEDY.max_tokens for ids in llama[4]["greedy"])
    assert llama[4]["greedy"] == llama[1]["greedy"]


def test_smollm2_tp3_greedy_equals_tp1(smollm2):
    assert smollm2[3]["greedy"] == smollm2[1]["greedy"]
    assert smollm2[1]["text"][0].startswith(" Paris")


@pytest.fixture(scope="module", params=[TINY_QWEN2, TINY_MISTRAL])
def against_hf(request, hf_model, hf_tokenizer, hf_greedy) -> dict:
    """One model's 16 greedy tokens for every prompt: transformers', and ours at TP=1 and 2."""
    name, greedy = request.param, SamplingParams(max_tokens=16, ignore_eos=True)
    prompts = [hf_tokenizer(name)(p).input_ids for p in PROMPTS]
    return {"hf": [hf_greedy(hf_model(name), ids, greedy.max_tokens) for ids in prompts],
            **greedy_by_tp(MODELS_DIR / name, prompts, greedy, OPTIONS)}


def test_tiny_qwen2_and_mistral_equal_transformers_at_tp1_and_tp2(against_hf):
    assert all(len(ids) == 16 for ids in against_hf["hf"])
    assert against_hf[1] == against_hf["hf"]
    assert against_hf[2] == against_hf["hf"]


@pytest.mark.parametrize("fixture, tp", [("qwen3", 2), ("llama", 4)])
def test_seeded_sampling_equals_tp1(request, fixture, tp):
    # Logits are gathered whole on every rank and every rank's generator has the same seed,
    # so each rank draws what TP=1 draws. Had one rank drawn another token, its next step
    # would compute a different sequence and the sums would be garbage from there on.
    runs = request.getfixturevalue(fixture)
    assert runs[tp]["sampled"] == runs[1]["sampled"]
    assert runs[1]["sampled"] != runs[1]["greedy"]  # it did sample


# ----------------------------------------------------------------------------------------------
# Sharded loading in this process: pretend to be rank r of N while loading (conftest.as_tp_rank).


def param_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


@pytest.fixture(scope="module")
def qwen3_checkpoint() -> dict[str, torch.Tensor]:
    """tiny-qwen3's tensors as stored, under the checkpoint's own names."""
    with safe_open(MODELS_DIR / TINY_QWEN3 / "model.safetensors", framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


@pytest.fixture(scope="module")
def qwen3_shards() -> dict[int, list]:
    """tiny-qwen3 loaded as every rank of TP=2 and TP=4 (and whole, TP=1)."""
    path = MODELS_DIR / TINY_QWEN3
    return {n: [load_as(path, r, n) for r in range(n)] for n in (1, 2, 4)}


def test_loading_restores_the_tp_info():
    load_as(MODELS_DIR / TINY_QWEN3, 1, 2)
    assert get_tp_info() == TPInfo()


@pytest.mark.parametrize("n", [2, 4])
def test_each_rank_holds_its_shapes(qwen3_shards, n):
    # tiny-qwen3: 8 query heads, 4 KV heads of 32, hidden 128, intermediate 256, vocab 49,152.
    q, kv, d, h, i, v = 8, 4, 32, 128, 256, 49152
    for model in qwen3_shards[n]:
        layer = model.model.layers[0]
        assert layer.self_attn.qkv_proj.weight.shape == ((q + 2 * kv) * d // n, h)
        assert layer.self_attn.o_proj.weight.shape == (h, q * d // n)
        assert layer.mlp.gate_up_proj.weight.shape == (2 * i // n, h)
        assert layer.mlp.down_proj.weight.shape == (h, i // n)
        assert model.model.embed_tokens.weight.shape == (v // n, h)
        assert model.lm_head.weight.shape == (v // n, h)  # untied in tiny-qwen3
        assert layer.self_attn.q_norm.weight.shape == (d,)  # replicated


def test_tp2_shapes_spelled_out(qwen3_shards):
    layer = qwen3_shards[2][1].model.layers[3]
    assert [tuple(layer.self_attn.qkv_proj.weight.shape), tuple(layer.self_attn.o_proj.weight.shape),
            tuple(layer.mlp.gate_up_proj.weight.shape), tuple(layer.mlp.down_proj.weight.shape)] \
        == [(256, 128), (128, 128), (256, 128), (128, 128)]


@pytest.mark.parametrize("n", [2, 4])
def test_qkv_shards_are_head_blocks_that_rebuild_q_k_v(qwen3_shards, qwen3_checkpoint, n):
    q_rows, kv_rows = 8 * 32 // n, 4 * 32 // n  # this rank's q heads, its k (and v) heads
    for layer_id in range(4):
        prefix = f"model.layers.{layer_id}.self_attn."
        shards = [m.model.layers[layer_id].self_attn.qkv_proj.weight for m in qwen3_shards[n]]
        q = torch.cat([s[:q_rows] for s in shards])
        k = torch.cat([s[q_rows : q_rows + kv_rows] for s in shards])
        v = torch.cat([s[q_rows + kv_rows :] for s in shards])
        assert torch.equal(q, qwen3_checkpoint[prefix + "q_proj.weight"])
        assert torch.equal(k, qwen3_checkpoint[prefix + "k_proj.weight"])
        assert torch.equal(v, qwen3_checkpoint[prefix + "v_proj.weight"])


def test_qkv_bias_is_sharded_with_its_rows():
    # tiny-qwen2: each rank's bias rows belong to its own q, k and v heads.
    with safe_open(MODELS_DIR / TINY_QWEN2 / "model.safetensors", framework="pt") as f:
        bias = {part: f.get_tensor(f"model.layers.2.self_attn.{part}_proj.bias")
                for part in "qkv"}
    shards = [load_as(MODELS_DIR / TINY_QWEN2, r, 2).model.layers[2].self_attn.qkv_proj
              for r in range(2)]
    q_rows, kv_rows = 8 * 32 // 2, 4 * 32 // 2
    assert [tuple(s.bias.shape) for s in shards] == [(q_rows + 2 * kv_rows,)] * 2
    assert torch.equal(torch.cat([s.bias[:q_rows] for s in shards]), bias["q"])
    assert torch.equal(torch.cat([s.bias[q_rows : q_rows + kv_rows] for s in shards]), bias["k"])
    assert torch.equal(torch.cat([s.bias[q_rows + kv_rows :] for s in shards]), bias["v"])
    assert all(s.weight.shape[0] == s.bias.shape[0] for s in shards)


def test_qkv_shard_is_not_a_contiguous_slice_of_the_fused_matrix(qwen3_shards):
    # Rank 0's first fused rows are q heads 0-3, but then come k heads 0-1, not q heads 4-7.
    whole = qwen3_shards[1][0].model.layers[0].self_attn.qkv_proj.weight
    rank0 = qwen3_shards[2][0].model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(rank0[:128], whole[:128])
    assert not torch.equal(rank0, whole[: len(rank0)])
    assert torch.equal(rank0[128:192], whole[256:320])  # k heads 0-1 of the full fused matrix


@pytest.mark.parametrize("n", [2, 4])
def test_gate_up_shards_rebuild_gate_and_up(qwen3_shards, qwen3_checkpoint, n):
    rows = 256 // n
    shards = [m.model.layers[2].mlp.gate_up_proj.weight for m in qwen3_shards[n]]
    gate = torch.cat([s[:rows] for s in shards])
    up = torch.cat([s[rows:] for s in shards])
    assert torch.equal(gate, qwen3_checkpoint["model.layers.2.mlp.gate_proj.weight"])
    assert torch.equal(up, qwen3_checkpoint["model.layers.2.mlp.up_proj.weight"])


@pytest.mark.parametrize("n", [2, 4])
def test_row_parallel_shards_are_column_blocks(qwen3_shards, qwen3_checkpoint, n):
    for name, get in [("self_attn.o_proj", lambda l: l.self_attn.o_proj.weight),
                      ("mlp.down_proj", lambda l: l.mlp.down_proj.weight)]:
        shards = [get(m.model.layers[1]) for m in qwen3_shards[n]]
        assert torch.equal(torch.cat(shards, dim=1),
                           qwen3_checkpoint[f"model.layers.1.{name}.weight"])


@pytest.mark.parametrize("n", [2, 4])
def test_vocab_shards_are_row_blocks(qwen3_shards, qwen3_checkpoint, n):
    embed = torch.cat([m.model.embed_tokens.weight for m in qwen3_shards[n]])
    head = torch.cat([m.lm_head.weight for m in qwen3_shards[n]])
    assert torch.equal(embed, qwen3_checkpoint["model.embed_tokens.weight"])
    assert torch.equal(head, qwen3_checkpoint["lm_head.weight"])


@pytest.mark.parametrize("n", [2, 4])
def test_norms_are_replicated_and_no_rank_holds_the_model(qwen3_shards, n):
    whole = qwen3_shards[1][0].state_dict()
    replicated = {k: t for k, t in whole.items() if k.endswith("norm.weight")}
    extra = sum(t.numel() * t.element_size() for t in replicated.values())
    for model in qwen3_shards[n]:
        state = model.state_dict()
        assert all(torch.equal(state[k], t) for k, t in replicated.items())
        assert param_bytes(model) < param_bytes(qwen3_shards[1][0]) / n + extra
    # The shards add up to the model once, plus a copy of every norm on each further rank.
    total = sum(param_bytes(m) for m in qwen3_shards[n])
    assert total == param_bytes(qwen3_shards[1][0]) + (n - 1) * extra


class RecordingFile:
    """A safetensors file handle that records which tensors were read whole."""

    def __init__(self, f) -> None:
        self.f, self.whole = f, []

    def get_tensor(self, name: str) -> torch.Tensor:
        self.whole.append(name)
        return self.f.get_tensor(name)

    def get_slice(self, name: str):
        return self.f.get_slice(name)


def test_a_rank_reads_only_replicated_tensors_whole():
    from minisgl.models.weight import read_shard

    with as_tp_rank(1, 2):
        with safe_open(MODELS_DIR / TINY_QWEN3 / "model.safetensors", framework="pt") as f:
            recording = RecordingFile(f)
            names = list(f.keys())
            for name in names:
                read_shard(recording, name)
    assert recording.whole and all(name.endswith("norm.weight") for name in recording.whole)
    assert len(recording.whole) == sum(name.endswith("norm.weight") for name in names)


@pytest.fixture
def uneven_checkpoint(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A synthetic file: a vocabulary of 10 rows (not a multiple of 3), biases of both kinds."""
    tensors = {
        "model.embed_tokens.weight": torch.arange(40.0).reshape(10, 4),
        "lm_head.weight": -torch.arange(40.0).reshape(10, 4),
        "model.layers.0.self_attn.q_proj.bias": torch.arange(6.0),
        "model.layers.0.self_attn.o_proj.weight": torch.arange(24.0).reshape(4, 6),
        "model.layers.0.self_attn.o_proj.bias": torch.arange(4.0),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    return path, tensors


def read_as_ranks(path: Path, name: str, size: int) -> list[torch.Tensor]:
    from minisgl.models.weight import read_shard

    parts = []
    with safe_open(path, framework="pt") as f:
        for rank in range(size):
            with as_tp_rank(rank, size):
                parts.append(read_shard(f, name))
    return parts


def test_vocab_shard_rounds_up_and_the_last_rank_is_padded():
    starts = []
    for rank in range(3):
        with as_tp_rank(rank, 3):
            starts.append(vocab_shard(10))
    assert starts == [(0, 4), (4, 4), (8, 4)]


@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "lm_head.weight"])
def test_an_uneven_vocabulary_is_padded_with_zero_rows(uneven_checkpoint, name):
    path, tensors = uneven_checkpoint
    parts = read_as_ranks(path, name, 3)
    assert [tuple(p.shape) for p in parts] == [(4, 4)] * 3
    joined = torch.cat(parts)
    assert torch.equal(joined[:10], tensors[name])
    assert torch.equal(joined[10:], torch.zeros(2, 4))


def test_biases_column_parallel_split_row_parallel_whole(uneven_checkpoint):
    path, tensors = uneven_checkpoint
    q_bias = read_as_ranks(path, "model.layers.0.self_attn.q_proj.bias", 2)
    assert [p.tolist() for p in q_bias] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    o_bias = read_as_ranks(path, "model.layers.0.self_attn.o_proj.bias", 2)
    assert all(torch.equal(p, tensors["model.layers.0.self_attn.o_proj.bias"]) for p in o_bias)
    o_weight = read_as_ranks(path, "model.layers.0.self_attn.o_proj.weight", 2)
    assert [tuple(p.shape) for p in o_weight] == [(4, 3), (4, 3)]


# ----------------------------------------------------------------------------------------------
# Spawned gloo groups. The workers are top-level functions: a spawned child imports this
# module to find them, so the module's own imports stay light (no transformers at the top).

VOCAB, HIDDEN = 10, 8  # 10 rows over 3 ranks: 4, 4, and 2 + 2 rows of padding


def _gloo_worker(rank: int, size: int, address: str, out: str) -> None:
    init_distributed(TPInfo(rank, size), torch.device("cpu"), address)
    try:
        comm = get_comm()
        results: dict[str, object] = {"comm": type(comm).__name__}
        g = torch.Generator().manual_seed(rank)
        results["mine"] = torch.randn(3, 5, generator=g)
        results["all_reduce"] = comm.all_reduce(results["mine"].clone())
        results["all_gather"] = comm.all_gather(torch.tensor([[rank, 10.0 + rank]]))
        results["min"] = comm.min_over_ranks([100, 93, 107][rank])

        same = torch.Generator().manual_seed(0)  # the same full matrices on every rank
        weight = torch.randn(VOCAB, HIDDEN, generator=same)
        x = torch.randn(5, HIDDEN, generator=same)
        embedding, head = Embedding(VOCAB, HIDDEN), LMHead(VOCAB, HIDDEN)
        results["vocab_range"] = embedding.vocab_range
        start, rows = [(0, 4), (4, 4), (8, 4)][rank]  # by hand: ceil(10 / 3) = 4 rows a rank
        shard = weight[start : start + rows]
        shard = torch.cat([shard, shard.new_zeros(rows - len(shard), HIDDEN)])
        embedding.weight = head.weight = shard
        tied = LMHead(VOCAB, HIDDEN, tied_embedding=embedding)
        results["weight"], results["x"] = weight, x
        results["embedding"] = embedding.forward(torch.tensor([9, 0, 4, 8, 3, 7, 9]))
        results["logits"] = head.forward(x)
        results["tied_logits"] = tied.forward(x)
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        destroy_distributed()


def _engine_worker(rank: int, size: int, address: str, out: str) -> None:
    from minisgl.engine import Engine, EngineConfig

    # Ranks offer different KV budgets; they must agree on the smaller one.
    budget = [3, 2][rank] << 20
    config = EngineConfig(str(MODELS_DIR / TINY_QWEN3), device="cpu", tp_rank=rank, tp_size=size,
                          dist_init_address=address, cpu_kv_cache_bytes=budget,
                          max_seq_len_override=128)
    engine = Engine(config)
    try:
        torch.save({"num_pages": engine.num_pages, "pool_pages": engine.kv_pool.num_pages,
                    "spare": int(hasattr(engine, "dummy_row")),  # chapter 18: graph padding's page
                    "k_cache": tuple(engine.kv_pool.k_cache(0).shape),
                    "page_bytes": engine.kv_pool.bytes_per_page, "threads": engine.num_threads},
                   Path(out) / f"rank{rank}.pt")
    finally:
        engine.close()


def spawn_group(worker, size: int, out: Path) -> list[dict]:
    import torch.multiprocessing as tmp

    address = rendezvous_address(new_run_id())
    tmp.start_processes(worker, args=(size, address, str(out)), nprocs=size, join=True,
                        start_method="spawn")
    return [torch.load(out / f"rank{r}.pt") for r in range(size)]


@pytest.fixture(scope="module")
def gloo3(tmp_path_factory) -> list[dict]:
    return spawn_group(_gloo_worker, 3, tmp_path_factory.mktemp("gloo3"))


def test_group_uses_torch_distributed(gloo3):
    assert [r["comm"] for r in gloo3] == ["TorchDistributed"] * 3


def test_all_reduce_sums_and_every_rank_gets_the_same_bits(gloo3):
    expected = sum(r["mine"] for r in gloo3)
    for r in gloo3:
        assert torch.allclose(r["all_reduce"], expected, atol=1e-6)
        # Bit-identical on every rank: otherwise ranks could sample different tokens.
        assert torch.equal(r["all_reduce"], gloo3[0]["all_reduce"])


def test_all_gather_concatenates_the_last_dimension_in_rank_order(gloo3):
    for r in gloo3:
        assert r["all_gather"].tolist() == [[0.0, 10.0, 1.0, 11.0, 2.0, 12.0]]


def test_min_over_ranks(gloo3):
    assert [r["min"] for r in gloo3] == [93, 93, 93]


def test_each_rank_of_three_holds_four_vocabulary_rows(gloo3):
    assert [r["vocab_range"] for r in gloo3] == [(0, 4), (4, 4), (8, 4)]


def test_vocab_parallel_embedding_equals_the_unsharded_lookup(gloo3):
    weight = gloo3[0]["weight"]
    ids = torch.tensor([9, 0, 4, 8, 3, 7, 9])  # ids of every rank, the last rank's real rows
    for r in gloo3:
        assert torch.equal(r["embedding"], F.embedding(ids, weight))


@pytest.mark.parametrize("key", ["logits", "tied_logits"])
def test_vocab_parallel_lm_head_equals_the_unsharded_one(gloo3, key):
    weight, x = gloo3[0]["weight"], gloo3[0]["x"]
    for r in gloo3:
        assert r[key].shape == (5, VOCAB)  # the padding columns are cut off
        assert torch.allclose(r[key], x @ weight.T, atol=1e-5)
        assert torch.equal(r[key], gloo3[0][key])  # gathered: the same bits everywhere


@pytest.fixture(scope="module")
def engines2(tmp_path_factory) -> list[dict]:
    return spawn_group(_engine_worker, 2, tmp_path_factory.mktemp("engines2"))


def test_each_rank_caches_only_its_kv_heads(engines2):
    # tiny-qwen3 has 4 KV heads of 32: two per rank; a page (1 token) holds K and V of 4 layers.
    assert [r["k_cache"][1:] for r in engines2] == [(2, 32), (2, 32)]
    assert [r["page_bytes"] for r in engines2] == [2 * 4 * 2 * 32 * 4] * 2


def test_ranks_agree_on_the_smaller_kv_pool(engines2):
    # On the CPU the ranks share one machine's memory: each takes budget / size of it. Rank 1
    # offers 2 MiB: 1 MiB each, at 2,048 bytes a page (above) that is 512 pages; rank 0's 3 MiB
    # would give 768. From chapter 18 one of them is the spare page of graph padding.
    assert [r["pool_pages"] for r in engines2] == [512, 512]
    assert [r["num_pages"] + r["spare"] for r in engines2] == [512, 512]


def test_engine_rank_threads_are_cores_divided_by_tp(engines2):
    if "OMP_NUM_THREADS" in os.environ:
        pytest.skip("OMP_NUM_THREADS decides the thread count")
    expected = reference_cpu_threads(tp_size=2)  # sysfs and affinity, not utils.device
    if expected is None:
        pytest.skip("no CPU topology in /sys to compare with")
    assert [r["threads"] for r in engines2] == [expected] * 2


# ----------------------------------------------------------------------------------------------
# CPU threads per rank


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("physical, usable, tp, expected",
                         [(8, 8, 1, 8), (8, 8, 2, 4), (8, 8, 3, 2), (2, 2, 4, 1), (16, 6, 2, 3)])
def test_cpu_threads_are_cores_divided_by_tp(monkeypatch, torch_threads, physical, usable, tp,
                                             expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device_module, "physical_core_count", lambda: physical)
    monkeypatch.setattr(device_module, "usable_cpu_count", lambda: usable)
    assert configure_threads(torch.device("cpu"), tp) == expected == torch.get_num_threads()


def test_omp_num_threads_wins(monkeypatch, torch_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(device_module, "physical_core_count", lambda: 8)
    torch.set_num_threads(3)
    assert configure_threads(torch.device("cpu"), 2) == 3


# ----------------------------------------------------------------------------------------------
# Start-up: refused before any process, or a rank that dies while loading


@pytest.mark.parametrize("model, tp, message", [
    (SMOLLM2, 2, "the number of query heads (9) is not divisible by the TP size 2"),
    (TINY_QWEN3, 8, "the number of KV heads (4) is not divisible by the TP size 8"),
])
def test_indivisible_heads_fail_before_any_process_starts(model, tp, message):
    import multiprocessing

    from minisgl.llm import LLM
    from minisgl.models import check_tensor_parallel

    with pytest.raises(ValueError) as checked:
        check_tensor_parallel(MODELS_DIR / model, tp)
    assert message in str(checked.value)
    with pytest.raises(ValueError) as constructed:
        LLM(str(MODELS_DIR / model), tp_size=tp)
    assert message in str(constructed.value)
    assert multiprocessing.active_children() == []
    assert get_tp_info() == TPInfo()


def test_divisible_head_counts_pass_the_check():
    from minisgl.models import check_tensor_parallel

    check_tensor_parallel(MODELS_DIR / SMOLLM2, 3)
    check_tensor_parallel(MODELS_DIR / TINY_QWEN3, 4)
    assert get_tp_info() == TPInfo()


def test_server_refuses_indivisible_tp_before_loading():
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(MODELS_DIR / SMOLLM2),
                           "--tp", "2", "--port", "0"],
                          cwd=ROOT, env=minisgl_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "the number of query heads (9) is not divisible by the TP size 2" in done.stderr
    assert "loading" not in done.stdout + done.stderr
    assert time.monotonic() - start < 60


LLM_DRIVER = """
import sys
from minisgl.llm import LLM
try:
    LLM(sys.argv[1], tp_size=2, max_running_req=4, num_page_override=512)
except RuntimeError as e:
    print("LLM failed:", e, flush=True)
    sys.exit(1)
print("LLM started", flush=True)
"""


@pytest.mark.parametrize("launcher", ["llm", "server"])
def test_a_rank_dying_at_start_up_is_reported_and_nothing_is_left(launcher, tmp_path):
    model = str(model_that_never_loads(MODELS_DIR / TINY_QWEN3, tmp_path))
    argv = ([sys.executable, "-c", LLM_DRIVER, model] if launcher == "llm" else
            [sys.executable, "-m", "minisgl", "--model", model, "--tp", "2", "--num-pages", "512",
             "--port", "0"])
    child = Child(argv)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while len(ranks := workers_of(child.popen.pid)) < 2:
            assert child.popen.poll() is None, child.output
            assert time.monotonic() < deadline, child.output
            time.sleep(0.01)
        everyone = descendants_of(child.popen.pid)
        os.kill(ranks[1], signal.SIGKILL)  # scheduler-rank1: started second
        killed = time.monotonic()
        code = child.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        if child.popen.poll() is None:
            child.popen.kill()
            child.popen.wait()
    assert code == 1, child.output
    assert "scheduler-rank1 exited with code -9 before it was ready" in child.output
    assert "started" not in child.output and "ready" not in child.output.replace(
        "before it was ready", "")
    assert took < 20, f"took {took:.1f} s to give up"
    assert not wait_all_gone(everyone, timeout=5.0), "children left running"


LLM_SERVING_DRIVER = """
import sys
from minisgl.core import SamplingParams
from minisgl.llm import LLM
llm = LLM(sys.argv[1], tp_size=2, max_running_req=4, num_page_override=512)
print("LLM started", flush=True)
try:
    llm.generate(["hello"] * 4, SamplingParams(max_tokens=400, ignore_eos=True))
except RuntimeError as e:
    print("generate failed:", e, flush=True)
llm.shutdown()
print("LLM shut down", flush=True)
"""


@pytest.mark.parametrize("launcher", ["llm", "server"])
def test_a_rank_dying_while_serving_is_reported_and_nothing_is_left(launcher):
    """The other ranks would wait for it in their next all-reduce, forever: the launcher must
    notice the dead process itself, say which one, and stop."""
    model = str(MODELS_DIR / TINY_QWEN3)
    argv = ([sys.executable, "-c", LLM_SERVING_DRIVER, model] if launcher == "llm" else
            [sys.executable, "-m", "minisgl", "--model", model, "--tp", "2", "--num-pages", "512",
             "--port", "0"])
    child = Child(argv)
    try:
        child.wait_for("LLM started" if launcher == "llm" else "minisgl: ready")
        everyone = descendants_of(child.popen.pid)
        os.kill(workers_of(child.popen.pid)[1], signal.SIGKILL)  # scheduler-rank1
        code = child.wait(timeout=60)
    finally:
        if child.popen.poll() is None:
            child.popen.kill()
            child.popen.wait()
    if launcher == "llm":
        # Rank 0 may have died of the broken connection by then: it is named too.
        failure = next(line for line in child.lines if line.startswith("generate failed:"))
        assert code == 0 and "scheduler-rank1 was killed by SIGKILL" in failure
        assert "LLM shut down" in child.output
    else:
        assert code == 1, child.output
        assert "minisgl: scheduler-rank1 was killed by SIGKILL; " in child.output
        assert "minisgl: stopped" in child.output
    assert not wait_all_gone(everyone, timeout=5.0), "children left running"


def test_the_shell_stops_when_a_rank_dies():
    shell = subprocess.Popen(
        [sys.executable, "-m", "minisgl", "--model", str(MODELS_DIR / TINY_QWEN3), "--tp", "2",
         "--num-pages", "512", "--shell"], cwd=ROOT, env=minisgl_env(), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        lines = []
        while not any("Type a message" in line for line in lines):  # loaded: the shell greets
            line = shell.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        everyone = descendants_of(shell.pid)
        os.kill(workers_of(shell.pid)[1], signal.SIGKILL)  # scheduler-rank1
        out, _ = shell.communicate("Hello\n", timeout=60)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()
    assert shell.returncode == 1, out
    assert "scheduler-rank1 was killed by SIGKILL; the shell stops" in out, out
    assert not wait_all_gone(everyone, timeout=5.0), "children left running"


# ----------------------------------------------------------------------------------------------
# The server with --tp 2


@pytest.fixture(scope="module")
def server_tp2():
    """`python -m minisgl --tp 2` on tiny-qwen3, up; the last test that uses it stops it."""
    import httpx

    child = Child([sys.executable, "-m", "minisgl", "--model", str(MODELS_DIR / TINY_QWEN3),
                   "--tp", "2", "--port", "0", "--num-pages", "512", "--max-seq-len", "128"])
    try:
        url = child.served_url()
    except BaseException:
        child.popen.kill()
        child.popen.wait()
        raise
    child.children = descendants_of(child.popen.pid)
    child.http = httpx.Client(base_url=url, timeout=120)
    yield child
    child.http.close()
    if child.popen.poll() is None:  # the SIGTERM test was not selected: stop it the same way
        child.popen.send_signal(signal.SIGTERM)
        child.wait(timeout=30)


def test_server_runs_two_ranks_and_a_tokenizer(server_tp2):
    # N + 2 processes: this API server, one tokenizer/detokenizer, one scheduler per rank.
    assert len(workers_of(server_tp2.popen.pid)) == 3


def test_server_tp2_answers_like_tp1(server_tp2, qwen3):
    for prompt, text in zip(PROMPTS[:2], qwen3[1]["text"][:2]):
        r = server_tp2.http.post("/v1/completions", json={
            "prompt": prompt, "max_tokens": GREEDY.max_tokens, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == text


def test_server_tp2_stops_on_sigterm_with_no_children_left(server_tp2):
    server_tp2.popen.send_signal(signal.SIGTERM)
    assert server_tp2.wait(timeout=30) == 0, server_tp2.output
    assert "minisgl: stopped" in server_tp2.output
    assert not wait_all_gone(server_tp2.children, timeout=5.0), "children left running"


# ----------------------------------------------------------------------------------------------
# Engine.close at TP=2: each rank of a spawned gloo group builds Engines one after another.


def _reopen_worker(rank: int, size: int, addresses: list[str], out: str) -> None:
    """A constructor that fails after the group has formed, then twice: create, close, close
    again. Records the process-wide state the engine touches after each step."""
    from dataclasses import replace

    import torch.distributed as dist

    from minisgl.core import get_global_ctx
    from minisgl.engine import Engine, EngineConfig

    def state(engine=None) -> dict:
        try:
            ctx = get_global_ctx()
        except RuntimeError:
            ctx = None
        owner = "none" if ctx is None else "ours" if engine and ctx is engine.ctx else "other"
        tp = get_tp_info()
        return {"tp": (tp.rank, tp.size), "group": dist.is_initialized(),
                "comm": type(get_comm()).__name__, "threads": torch.get_num_threads(),
                "ctx": owner}

    # A thread count the engine changes (it takes cores // size), to see it put back.
    cores = min(device_module.physical_core_count(), device_module.usable_cpu_count())
    torch.set_num_threads(max(1, cores // size) + 1)
    config = EngineConfig(str(MODELS_DIR / TINY_QWEN3), device="cpu", tp_rank=rank, tp_size=size,
                          num_page_override=64, max_seq_len_override=64)
    results: dict[str, object] = {"before": state()}
    try:  # no rank has a KV budget for one page: each fails after the group has formed
        Engine(replace(config, dist_init_address=addresses[0], num_page_override=None,
                       cpu_kv_cache_bytes=1))
    except ValueError as e:
        results["error"] = str(e)
    results["after_failure"] = state()
    for i, address in enumerate(addresses[1:]):
        engine = Engine(replace(config, dist_init_address=address))
        results[f"open{i}"] = state(engine)
        engine.close()
        results[f"closed{i}"] = state()
        engine.close()
        results[f"closed_twice{i}"] = state()
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def reopened2(tmp_path_factory) -> list[dict]:
    import torch.multiprocessing as tmp

    out = tmp_path_factory.mktemp("reopened2")
    addresses = [rendezvous_address(new_run_id()) for _ in range(3)]
    tmp.start_processes(_reopen_worker, args=(2, addresses, str(out)), nprocs=2, join=True,
                        start_method="spawn")
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_a_tp2_engine_failing_after_its_group_formed_leaves_no_rank_or_group(reopened2):
    for r in reopened2:
        assert "budget" in r["error"]
        assert r["after_failure"] == r["before"]


def test_tp2_engines_closed_and_recreated_in_one_process(reopened2):
    for rank, r in enumerate(reopened2):
        assert r["before"]["tp"] == (0, 1) and not r["before"]["group"]
        assert r["before"]["comm"] == "SingleRank" and r["before"]["ctx"] == "none"
        for i in range(2):
            opened = r[f"open{i}"]
            assert (opened["tp"], opened["group"], opened["comm"], opened["ctx"]) \
                == ((rank, 2), True, "TorchDistributed", "ours")
            if "OMP_NUM_THREADS" not in os.environ:
                assert opened["threads"] != r["before"]["threads"]
            assert r[f"closed{i}"] == r[f"closed_twice{i}"] == r["before"]


# --- the chapter's example ---

import ast  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_tp2_matches_transformers_and_shards_as_the_formula_says(hf_model, hf_tokenizer,
                                                                          hf_greedy):
    out = run_example("ch16_tensor_parallel.py", timeout=600)
    tokenizer, hf = hf_tokenizer(TINY_QWEN3), hf_model(TINY_QWEN3)
    want = [tokenizer.decode(hf_greedy(hf, tokenizer(p).input_ids, 12))  # 12 tokens, ignore_eos
            for p in ["The capital of France is", "def fibonacci(n):"]]
    blocks = re.findall(r"^TP=(\d)（含启动 [\d.]+ 秒）\n((?:  '.*'\n|  \".*\"\n)+)", out, re.M)
    assert [tp for tp, _ in blocks] == ["1", "2"]
    for _, block in blocks:
        assert [ast.literal_eval(line.strip()) for line in block.splitlines()] == want
    assert "TP=2 与 TP=1 的 token 完全相同: True" in out
    assert ("SmolLM2 开 TP=2 → ValueError: the number of query heads (9) is not divisible by "
            "the TP size 2") in out  # the book's message, from the launcher
    # Each rank's shards by hand: column-parallel layers split their output rows, row-parallel
    # ones their input columns, the vocabulary is split in halves.
    c = json.loads((MODELS_DIR / TINY_QWEN3 / "config.json").read_text())
    hidden, head, inter, vocab = (c["hidden_size"], c["head_dim"], c["intermediate_size"],
                                  c["vocab_size"])
    q, kv = c["num_attention_heads"] // 2, c["num_key_value_heads"] // 2
    shapes = {"qkv_proj": ((q + 2 * kv) * head, hidden), "o_proj": (hidden, q * head),
              "gate_up_proj": (2 * (inter // 2), hidden), "down_proj": (hidden, inter // 2),
              "embed_tokens": (vocab // 2, hidden), "lm_head": (vocab // 2, hidden)}
    for rank in range(2):
        line = re.search(rf"^  rank {rank}: (.*)$", out, re.M).group(1)
        assert line == "，".join(f"{name} {shape}" for name, shape in shapes.items())
