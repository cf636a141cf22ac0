"""GPU attention backends on the CPU, through the fake flashinfer (tests/fake_flashinfer.py): our
FlashInfer and FA backends' own code — metadata, plan once per batch, two wrapper sets in turn,
paged pool views — against the torch backend on random batches, then whole generations against
transformers; the start-up refusals and what "auto" picks; and the vectorised page allocation
against a page-by-page reference, and its eviction when the free pages run short. The real
kernels run in tests/test_gpu_attention_cuda.py."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import fake_flashinfer
from conftest import TINY_QWEN3
from minisgl.attention import (FlashAttentionBackend, FlashInferBackend, TorchAttentionBackend,
                               create_attention_backend, resolve_attention_backend)
from minisgl.attention import flashinfer_backend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVPool
from minisgl.llm import LLM
from minisgl.scheduler.cache import CacheManager
from minisgl.utils.ragged import ragged_arange

CHAPTER = 17  # tools/steps.py check runs this module on chapter 17's own tree

GPU_BACKENDS = ["flashinfer", "fa"]


@pytest.fixture
def fake_fi(monkeypatch):
    """The fake package in place of flashinfer, and the GPU-only start-up checks lifted: the
    fake computes on the CPU, in float32."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)
    for cls in (FlashInferBackend, FlashAttentionBackend):
        monkeypatch.setattr(cls, "unsupported_reason", classmethod(lambda cls, *args: None))
    fake_flashinfer.calls.clear()
    return fake_flashinfer


# --- one batch: a GPU backend against the torch backend -------------------------------------------

LAYERS, ROWS, WIDTH = 2, 6, 768
SHAPES = [(9, 3, 64), (16, 8, 128)]  # SmolLM2's and Qwen3-0.6B's query / KV heads, head_dim


def random_batch(seed: int, page_size: int, kv_heads: int, head_dim: int, phase: str,
                 dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A pool with shuffled pages and a batch of up to 5 requests: lengths up to 600 (several
    pages of 256), cached prefixes of random length for "prefix", one new token for "decode".
    Random values are drawn on the CPU in float32, so every device and dtype sees the same."""
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 6, (1,), generator=gen))
    lengths = torch.randint(1, 600, (n,), generator=gen).tolist()
    num_pages = sum(-(-length // page_size) for length in lengths) + 2
    pool = MHAKVPool(LAYERS, num_pages, page_size, kv_heads, head_dim, dtype, device)
    table = torch.zeros(ROWS, WIDTH, dtype=torch.int32)
    free = torch.randperm(num_pages, generator=gen).tolist()
    rows = torch.randperm(ROWS, generator=gen)[:n].tolist()
    for row, length in zip(rows, lengths):
        for pos in range(length):
            if pos % page_size == 0:
                page = free.pop()
            table[row, pos] = page * page_size + pos % page_size
    # Every token's K and V, prefix included, is in the pool already (stored before).
    pool.k_cache(1).copy_(torch.randn(pool.k_cache(1).shape, generator=gen))
    pool.v_cache(1).copy_(torch.randn(pool.v_cache(1).shape, generator=gen))
    table = table.to(device)
    if phase == "decode":
        cached = [length - 1 for length in lengths]
    elif phase == "prefix":
        cached = [int(torch.randint(0, length, (1,), generator=gen)) for length in lengths]
    else:
        cached = [0] * n
    reqs = [Req(torch.zeros(length, dtype=torch.int32), table_idx=row, cached_len=c,
                output_len=1, uid=i, sampling_params=SamplingParams())
            for i, (row, length, c) in enumerate(zip(rows, lengths, cached))]
    batch = Batch(reqs, "decode" if phase == "decode" else "prefill")
    batch.out_loc = torch.cat([table[r.table_idx, r.cached_len:r.device_len] for r in reqs]).long()
    return pool, table, batch, gen


@pytest.mark.parametrize("phase", ["prefill", "prefix", "decode"])
@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}q{s[1]}kv{s[2]}")
@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_backend_matches_torch_backend(fake_fi, name, shape, page_size, phase):
    q_heads, kv_heads, head_dim = shape
    for seed in range(2):
        pool, table, batch, gen = random_batch(seed, page_size, kv_heads, head_dim, phase)
        tokens = len(batch.out_loc)
        q = torch.randn(tokens, q_heads, head_dim, generator=gen)
        # The new tokens' K/V as the pool holds them: storing them again changes nothing.
        k = pool.k_cache(1)[batch.out_loc].clone()
        v = pool.v_cache(1)[batch.out_loc].clone()
        reference = TorchAttentionBackend(pool, table)
        reference.prepare_metadata(batch)
        expected = reference.forward(q, k, v, 1, batch)
        expected_last = batch.attn_metadata.last_indices
        backend = create_attention_backend(name, pool, table, q_heads)
        backend.prepare_metadata(batch)
        torch.testing.assert_close(backend.forward(q, k, v, 1, batch), expected,
                                   atol=1e-5, rtol=1e-5)
        assert torch.equal(batch.attn_metadata.last_indices, expected_last)
        kind = "decode" if phase == "decode" else "prefill"
        assert fake_fi.calls[-2:] == [("plan", kind), ("run", kind)]


def test_fa_backend_prefills_with_fa3_and_decodes_with_flashinfer(fake_fi):
    pool, table, batch, _ = random_batch(0, 16, 8, 128, "prefill")
    backend = create_attention_backend("fa", pool, table, 16)
    for prefill, decode in backend.wrapper_sets:
        assert prefill.backend == "fa3" and decode.backend == "auto"
    fi = create_attention_backend("flashinfer", pool, table, 16)
    assert all(prefill.backend == "fa2" for prefill, _ in fi.wrapper_sets)


def test_consecutive_batches_alternate_wrapper_sets(fake_fi):
    """Batch i+1 is planned while batch i may still run (overlap): it must not overwrite the
    plan batch i's kernels read."""
    pool, table, batch, _ = random_batch(1, 16, 3, 64, "decode")
    backend = create_attention_backend("flashinfer", pool, table, 9)
    wrappers = []
    for _ in range(4):
        backend.prepare_metadata(batch)
        wrappers.append(batch.attn_metadata.wrapper)
    assert wrappers[0] is not wrappers[1] and wrappers[0] is wrappers[2]
    assert wrappers[1] is wrappers[3]


# --- whole generations ----------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The capital of France is a city that"]  # the last shares a prefix with the first


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_generation_equals_transformers(fake_fi, name, page_size, models_dir, hf_model,
                                        hf_tokenizer, hf_greedy):
    """tiny-qwen3 in float32 with the fake kernels: the same greedy tokens as transformers, with
    a radix-cache hit, chunked prefill and overlap scheduling; and the call pattern of a real
    run: every batch planned once, then one run() per layer."""
    path = models_dir / TINY_QWEN3
    tokenizer = hf_tokenizer(TINY_QWEN3)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    llm = LLM(str(path), attention_backend=name, page_size=page_size, max_running_req=4,
              num_page_override=512, max_seq_len_override=256, max_prefill_length=8)
    try:
        assert llm.backend.scheduler.engine.attention_backend_name == name
        first = llm.generate(prompts[:1], SamplingParams(max_tokens=12, ignore_eos=True))
        rest = llm.generate(prompts[1:], SamplingParams(max_tokens=12, ignore_eos=True))
    finally:
        llm.shutdown()
    hf = hf_model(TINY_QWEN3)
    expected = [hf_greedy(hf, p, 12) for p in prompts]
    assert [o["token_ids"] for o in first + rest] == expected
    layers = hf.config.num_hidden_layers
    calls = fake_fi.calls
    assert calls and len(calls) % (layers + 1) == 0
    for i in range(0, len(calls), layers + 1):
        plan, runs = calls[i], calls[i + 1: i + layers + 1]
        assert plan[0] == "plan" and runs == [("run", plan[1])] * layers, calls[i: i + layers + 1]


# --- refused at start-up ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_backends_are_refused_on_the_cpu_with_the_reason(name):
    with pytest.raises(ValueError, match=rf"'{name}' cannot run here: .*CUDA.*--attn torch"):
        resolve_attention_backend(name, torch.device("cpu"), torch.float32, 64)


def test_auto_is_torch_on_the_cpu():
    assert resolve_attention_backend("auto", torch.device("cpu"), torch.float32, 64) == "torch"


@pytest.mark.parametrize("dtype, head_dim, expected", [(torch.bfloat16, 128, "flashinfer"),
                                                       (torch.float32, 128, "torch"),
                                                       (torch.bfloat16, 80, "torch")])
def test_auto_on_a_gpu_is_the_first_backend_that_can_run(dtype, head_dim, expected, monkeypatch):
    """With the device faked as a Hopper GPU and flashinfer "installed": flashinfer when it can
    run, else torch (fa, second in AUTO_ORDER, refuses whatever flashinfer refuses)."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_attention_backend("auto", torch.device("cuda"), dtype, head_dim) == expected


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_refusal_reasons_on_a_gpu(name, monkeypatch):
    """Each reason, with the device faked as CUDA (no CUDA call is made before the package
    check; FA's Hopper check is given a capability)."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(ValueError, match="float16 or bfloat16.*torch.float32.*--dtype bfloat16"):
        resolve_attention_backend(name, cuda, torch.float32, 64)
    with pytest.raises(ValueError, match=r"head_dim \(64, 128, 256\).*is 80"):
        resolve_attention_backend(name, cuda, torch.bfloat16, 80)
    monkeypatch.setattr(flashinfer_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"flashinfer-python is not installed.*\[gpu\]"):
        resolve_attention_backend(name, cuda, torch.bfloat16, 128)


def test_fa_needs_hopper(monkeypatch, fake_fi):
    monkeypatch.undo()  # the real checks, with the package "installed" and an Ampere GPU
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    cuda = torch.device("cuda")
    assert resolve_attention_backend("flashinfer", cuda, torch.bfloat16, 128) == "flashinfer"
    with pytest.raises(ValueError, match="Hopper.*sm_80.*--attn flashinfer"):
        resolve_attention_backend("fa", cuda, torch.bfloat16, 128)


def test_engine_refuses_before_loading_weights(models_dir, monkeypatch):
    from minisgl import models
    monkeypatch.setattr(models, "read_checkpoint", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(ValueError, match="'flashinfer' cannot run here"):
        LLM(str(models_dir / TINY_QWEN3), attention_backend="flashinfer")


def test_server_refuses_before_starting_processes(models_dir, capsys):
    from minisgl.server.args import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--model", str(models_dir / TINY_QWEN3), "--attn", "fa", "--device", "cpu",
                    "--shell"])  # no port to check
    assert "'fa' cannot run here" in capsys.readouterr().err


# --- host-side preparation ----------------------------------------------------------------------------

def allocate_page_by_page(free_pages: list[int], table: torch.Tensor, reqs: list[Req],
                          page_size: int) -> None:
    """The reference: one page at a time, popped from the end of the free list."""
    for req in reqs:
        first, last = -(-req.cached_len // page_size), -(-req.device_len // page_size)
        for index in range(first, last):
            page = free_pages.pop()
            table[req.table_idx, index * page_size:(index + 1) * page_size] = torch.arange(
                page * page_size, (page + 1) * page_size)


def test_ragged_arange_equals_one_arange_per_segment():
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        n = int(torch.randint(0, 7, (1,), generator=gen))
        starts = torch.randint(0, 50, (n,), generator=gen)
        counts = torch.randint(0, 5, (n,), generator=gen)  # empty segments included
        owner, values = ragged_arange(starts, counts)
        expected = [(r, v) for r in range(n)
                    for v in range(int(starts[r]), int(starts[r] + counts[r]))]
        assert list(zip(owner.tolist(), values.tolist())) == expected


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_allocate_equals_page_by_page(page_size):
    gen = torch.Generator().manual_seed(page_size)
    manager = CacheManager(3000, page_size, torch.zeros(8, 512, dtype=torch.int32), "naive")
    free, table = list(manager.free_pages), manager.page_table.clone()
    for _ in range(5):  # rounds: some requests start fresh, some extend what they hold
        reqs = []
        for row in torch.randperm(8, generator=gen)[:int(torch.randint(1, 9, (1,), generator=gen))]:
            cached = int(torch.randint(0, 40, (1,), generator=gen)) * page_size // 2
            extend = int(torch.randint(1, 30, (1,), generator=gen))
            reqs.append(Req(torch.zeros(cached + extend, dtype=torch.int32),
                            table_idx=int(row), cached_len=cached, output_len=1, uid=0,
                            sampling_params=SamplingParams()))
        manager.allocate(reqs)
        allocate_page_by_page(free, table, reqs, page_size)
        assert manager.free_pages == free
        assert torch.equal(manager.page_table, table)


@pytest.mark.parametrize("page_size", [1, 4])
def test_allocate_evicts_the_cached_pages_it_lacks_and_counts_them(page_size):
    manager = CacheManager(8, page_size, torch.zeros(2, 64, dtype=torch.int32), "radix")
    for i in range(6):  # six one-page prefixes, oldest first, hold six of the eight pages
        page = manager.free_pages.pop()
        manager.prefix_cache.insert_prefix([1000 + i] * page_size, torch.arange(
            page * page_size, (page + 1) * page_size, dtype=torch.int32))
    req = Req(torch.zeros(5 * page_size, dtype=torch.int32), table_idx=0, cached_len=0,
              output_len=1, uid=0, sampling_params=SamplingParams())
    manager.allocate([req])  # five pages: the two free ones and the three oldest prefixes'
    assert manager.free_pages == [] and manager.evicted_pages == 3
    assert manager.prefix_cache.evictable_size == 3 * page_size  # the three youngest stay
    pages = manager.page_table[0, : 5 * page_size : page_size] // page_size
    assert sorted(pages.tolist()) == [0, 1, 5, 6, 7]


def test_append_host_writes_into_room_kept_for_the_tokens():
    """Appending is a write into the request's own buffer: the tokens before it are not copied
    (same storage throughout), a view taken earlier still reads what it read, and the caller's
    prompt tensor is never written. One token more than the request may hold is refused."""
    prompt = torch.tensor([5, 6, 7], dtype=torch.int32)
    req = Req(prompt, table_idx=0, cached_len=0, output_len=3, uid=9,
              sampling_params=SamplingParams(max_tokens=3))
    storage, before = req.input_ids.data_ptr(), req.input_ids
    for token in (11, 12, 13):
        req.complete_one()
        req.append_host(token)
    assert req.input_ids.tolist() == [5, 6, 7, 11, 12, 13] and req.input_ids.dtype == torch.int32
    assert req.input_ids.data_ptr() == storage and req.output_ids == [11, 12, 13]
    assert before.tolist() == [5, 6, 7] and prompt.tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="request 9 already holds its 6 tokens"):
        req.append_host(14)


# --- the chapter's example ---

import ast  # noqa: E402
import re  # noqa: E402

from conftest import SMOLLM2  # noqa: E402
from processes import run_example  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answers are checked here")
def test_example_picks_torch_and_explains_refusals(hf_model, hf_tokenizer, hf_greedy):
    out = run_example("ch17_gpu_attention.py")
    assert re.search(r"^auto 选了： torch$", out, re.M)
    text = ast.literal_eval(re.search(r"^  → (.*)$", out, re.M).group(1))
    tokenizer = hf_tokenizer(SMOLLM2)
    prompt = tokenizer("The capital of France is").input_ids
    assert text == tokenizer.decode(hf_greedy(hf_model(SMOLLM2), prompt, 12))
    for name in ("flashinfer", "fa"):
        assert re.search(rf"^--attn {name}：attention backend '{name}' cannot run here: "
                         r"FlashInfer's kernels run on CUDA GPUs, and the device is cpu", out, re.M)


def test_sampler_skips_the_filter_when_no_request_filters():
    """Temperature alone, beside greedy requests whatever their top_k: no top-k/top-p arguments
    (the filter sorts every row over the whole vocabulary), and the same draws as with the
    filter's do-nothing values."""
    from minisgl.engine.sampler import Sampler, SamplingArgs

    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3),
              SamplingParams(temperature=0.0, top_k=5), SamplingParams(temperature=0.9, top_k=1)]
    reqs = [Req(torch.tensor([1, 2]), table_idx=i, cached_len=0, output_len=4, uid=i,
                sampling_params=p) for i, p in enumerate(params)]
    logits = torch.randn(4, 50)
    sampler = Sampler(torch.device("cpu"), 50, seed=7)
    args = sampler.prepare(Batch(reqs, "decode"))
    assert args is not None and args.top_k is None and args.top_p is None
    no_op = SamplingArgs(args.temperatures, torch.full((4,), 50), torch.ones(4))
    draws = [sampler.sample(logits, args) for _ in range(20)]
    again = Sampler(torch.device("cpu"), 50, seed=7)
    assert all(torch.equal(d, again.sample(logits, no_op)) for d in draws)


def test_a_placeholder_checkpoint_skips_gpu_tests_with_the_reason(tmp_path):
    """A GPU test whose model has an empty (or cut-off, or Git LFS pointer) model.safetensors
    skips and says so, instead of failing in the loader with "header too small"."""
    from safetensors.torch import save_file

    from gpu_helpers import gpu_model, require_weights

    def skip_reason(path):
        with pytest.raises(pytest.skip.Exception) as e:
            require_weights(path)
        return str(e.value)

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert skip_reason(model) == "model's weights are not on this machine"
    weights = model / "model.safetensors"
    weights.write_bytes(b"")
    assert "model.safetensors (0 bytes) is a placeholder" in skip_reason(model)
    weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n")
    assert "is a placeholder, not weights" in skip_reason(model)
    save_file({"w": torch.ones(4)}, weights)
    weights.write_bytes(weights.read_bytes()[:20])  # cut off inside the header
    assert "is a placeholder" in skip_reason(model)
    save_file({"w": torch.ones(4)}, weights)
    assert require_weights(model) == model
    # The GPU tests' fallback model is chosen the same way.
    (tmp_path / "qwen3-0.6b-random").symlink_to(model)
    assert gpu_model(tmp_path) == tmp_path / "qwen3-0.6b-random"
    weights.write_bytes(b"")
    with pytest.raises(pytest.skip.Exception, match="neither SmolLM2's weights"):
        gpu_model(tmp_path)


@pytest.mark.parametrize("width, fused", [(2 * 32, True), (2 * 20, False)])
def test_silu_and_mul_leaves_flashinfer_a_half_that_is_not_whole_16_byte_pieces(
        monkeypatch, width: int, fused: bool) -> None:
    """FlashInfer's silu_and_mul reads 16 bytes at a time: with 20 bfloat16 values a half (40
    bytes) the second row's loads are misaligned on a GPU, so the reference computes it."""
    from minisgl.kernel import activation

    used = []
    fake = types.SimpleNamespace(silu_and_mul=lambda x: used.append(x) or activation.F.silu(
        x.chunk(2, dim=-1)[0]) * x.chunk(2, dim=-1)[1])
    monkeypatch.setattr(activation, "flashinfer_for", lambda x: fake)
    x = torch.randn(3, width).to(torch.bfloat16)
    gate, up = x.chunk(2, dim=-1)
    assert torch.equal(activation.silu_and_mul(x), torch.nn.functional.silu(gate) * up)
    assert bool(used) == fused
