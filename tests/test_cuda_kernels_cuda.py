"""Our CUDA kernels on a real GPU (skipped without CUDA or nvcc): each against the reference op
on the same inputs in bfloat16, and a model's greedy tokens with and without them."""

from __future__ import annotations

import pytest
import torch

from conftest import SMOLLM2
from gpu_helpers import PROMPTS, assert_same_up_to_near_ties, require_weights
from test_cuda_kernels import (TOLERANCE, decode_case, gumbel_max_reference, plan_and_attend,
                               plan_items, reference_decode_attention, relative_error)
from minisgl.attention import FlashInferBackend
from minisgl.attention.custom_decode import CustomDecodeAttention
from minisgl.core import SamplingParams
from minisgl.kernel import apply_rotary_inplace, cuda_kernels, jit, rms_norm
from minisgl.llm import LLM

CHAPTER = 19
FIVE_PROMPTS = [*PROMPTS, "The sun rises in the"]  # one more than the GEMV's rows

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(jit.nvcc_path() is None, reason="needs nvcc to build the kernels"),
]


@pytest.fixture
def on_gpu():
    previous = cuda_kernels.set_mode("auto")
    yield
    cuda_kernels.set_mode(previous)


@pytest.mark.parametrize("tokens", [1, 256, 16384])
def test_store_and_gather_are_exact(on_gpu, tokens):
    """Qwen3-0.6B's shapes: 8 KV heads of 128 per token, embedding rows of 1024."""
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    qkv = torch.randn(tokens, 32 * 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    k, v = (qkv[:, start:start + 1024].view(tokens, 8, 128) for start in (2048, 3072))
    out_loc = torch.randperm(20000, device="cuda", generator=gen)[:tokens]
    k_cache, v_cache = (torch.zeros(20000, 8, 128, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    assert cuda_kernels.store_kv(k_cache, v_cache, out_loc, k, v)
    assert torch.equal(k_cache[out_loc], k) and torch.equal(v_cache[out_loc], v)
    shard = torch.randn(75968, 1024, device="cuda", generator=gen, dtype=torch.bfloat16)
    ids = torch.randint(-5, 151936 + 5, (tokens,), device="cuda", generator=gen)
    got = cuda_kernels.masked_gather(shard, ids, (75968, 75968))  # rank 1 of 2 holds these rows
    local = ids - 75968
    inside = (local >= 0) & (local < 75968)
    want = shard[local.clamp(0, 75967)] * inside[:, None].to(torch.bfloat16)
    assert got is not None and torch.equal(got, want)


@pytest.mark.parametrize("lengths, items_per_wave", [([1], 66), ([511], 66), ([4096], 66),
                                                     ([700, 3, 1, 2048], 66), ([100] * 32, 1)])
def test_decode_attention_matches_the_float64_reference(on_gpu, lengths, items_per_wave):
    """Qwen3-0.6B's heads (16 query, 8 KV, 128 wide) in bfloat16; output rounded once. The
    plan as the backend makes it on an H200 (66 chunks a wave, at least 64 tokens each): 8
    chunks for 511 tokens, 64 for 4,096, the four requests 11 + 1 + 1 + 32; one a request for
    a wave of 1."""
    case = decode_case(lengths, 16, 8, 128, torch.bfloat16, seed=len(lengths), device="cuda")
    want = reference_decode_attention(case, 128 ** -0.5)
    for _ in range(2):  # the counters are left at zero for the next launch
        out, _ = plan_and_attend(case, 128 ** -0.5, items_per_wave,
                                 cuda_kernels.DECODE_ATTENTION_MIN_CHUNK)
        assert out is not None
        assert (out.cpu().double() - want).abs().max().item() <= 2**-7 * want.abs().max()
    assert torch.equal(case["k_cache"][case["out_loc"]], case["k"])
    assert torch.equal(case["v_cache"][case["out_loc"]], case["v"])


def test_decode_attention_plan_on_the_gpu_is_the_emulators(on_gpu):
    """300 requests of 1-2,000 tokens (more than the plan kernel's 256 threads), planned for
    waves of 264 chunks (two waves: some requests cut in two): the plan the GPU makes is the
    CPU build's, item for item, and attention by it matches the float64 reference, as does
    attention by a plan of one chunk a request."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2000, (300,), generator=gen).tolist()
    case = decode_case(lengths, 16, 8, 128, torch.bfloat16, seed=1, device="cuda")
    want = reference_decode_attention(case, 128 ** -0.5)
    out, scratch = plan_and_attend(case, 128 ** -0.5, 264)
    whole, _ = plan_and_attend(case, 128 ** -0.5, 1)
    for got in (out, whole):
        assert got is not None
        assert (got.cpu().double() - want).abs().max().item() <= 2**-7 * want.abs().max()
    cuda_kernels.set_mode("emulate")
    cpu = cuda_kernels.decode_attention_scratch(300, 264, 16, 8, 128, torch.device("cpu"))
    assert cuda_kernels.decode_attention_plan(case["positions"].cpu(), 264, cpu, 1)
    assert plan_items(scratch[2].cpu()) == plan_items(cpu[2])
    assert {chunks for _, _, chunks, _ in plan_items(cpu[2])} == {1, 2}


def test_decode_attention_blocks_per_sm_follow_the_builds_registers():
    """The occupancy the backend sizes its chunks by: Qwen3-0.6B's build is held to 128
    registers a thread (its launch bounds), so 4 blocks of 128 threads fit an SM's 65,536
    registers; the build for 4 query heads a KV head (about 210 registers) fits fewer."""
    device = torch.device("cuda")
    qwen3 = cuda_kernels.decode_attention_blocks_per_sm(16, 8, 128, torch.bfloat16, device)
    group4 = cuda_kernels.decode_attention_blocks_per_sm(32, 8, 128, torch.bfloat16, device)
    assert qwen3 == 4 and 1 <= group4 < qwen3


@pytest.mark.parametrize("tokens", [1, 256])
def test_qk_norm_rope_rounds_as_the_cpu_reference(on_gpu, tokens):
    """Against the reference ops computed on the CPU (the norm rounds where transformers rounds
    it; FlashInfer's GPU norm rounds once less). Both round at the same places; they may differ
    by one bfloat16 step (2**-7 of the value) where the float32 math before a rounding differs:
    the sum of squares taken in another order, or a product and a sum that nvcc contracts into
    one FMA (one rounding where the CPU makes two)."""
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 32 * 128, generator=gen).to(torch.bfloat16)
    weight_q, weight_k = ((torch.rand(128, generator=gen) + 0.5).to(torch.bfloat16)
                          for _ in range(2))
    angles = torch.outer(torch.arange(4096, dtype=torch.float),
                         1.0 / 1e6 ** (torch.arange(0, 128, 2).float() / 128))
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    want_q = rms_norm(qkv[:, :2048].reshape(tokens, 16, 128), weight_q, 1e-6).flatten(1)
    want_k = rms_norm(qkv[:, 2048:3072].reshape(tokens, 8, 128), weight_k, 1e-6).flatten(1)
    apply_rotary_inplace(positions, want_q, want_k, 128, cache)
    gpu = qkv.cuda()
    assert cuda_kernels.qk_norm_rope(positions.cuda(), gpu[:, :2048], gpu[:, 2048:3072], 128,
                                     weight_q.cuda(), weight_k.cuda(), 1e-6, cache.cuda())
    error = relative_error(gpu[:, :3072].cpu(), torch.cat([want_q, want_k], 1))
    print(f"\nqk_norm_rope, {tokens} tokens: max relative error against the CPU reference "
          f"{error:.2e}")
    assert error <= TOLERANCE[torch.bfloat16]


def generate(path, dtype: torch.dtype, mode: str, prompts: list[str],
             cuda_graph_max_bs: int | None = None) -> list[list[int]]:
    llm = LLM(str(path), dtype=dtype, custom_kernels=mode, max_running_req=8,
              max_seq_len_override=512, num_page_override=4096, device="cuda",
              cuda_graph_max_bs=cuda_graph_max_bs,
              attention_backend="auto" if path.name == SMOLLM2 else "torch")  # tiny head_dim
    try:
        return [o["token_ids"] for o in llm.generate(
            prompts, SamplingParams(max_tokens=16, ignore_eos=True))]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("name,dtype", [(SMOLLM2, torch.bfloat16), ("tiny-llama", torch.bfloat16),
                                        ("tiny-qwen3", torch.float32)])
def test_same_greedy_tokens_with_and_without_our_kernels(models_dir, name, dtype):
    """Five prompts: every matmul has more rows than the GEMV takes (4), and FlashInfer attends
    (graphs hold at most 4 requests here, so the five decode eagerly, and no captured step
    runs our decode attention), so in Llama-style models (SmolLM2, tiny-llama: no q/k norm)
    only the store and the gather change, and both are exact: even in bfloat16 the tokens must
    be identical, not merely close. tiny-qwen3 runs the fused norm too, in float32, where it is
    within 1e-5 of the reference: its tokens must be identical too."""
    path = require_weights(models_dir / name)
    assert (generate(path, dtype, "auto", FIVE_PROMPTS, cuda_graph_max_bs=4)
            == generate(path, dtype, "off", FIVE_PROMPTS, cuda_graph_max_bs=4))


def test_the_default_engine_replays_our_decode_attention_over_flashinfer(models_dir):
    """With every default (--attn auto, graphs and our kernels on), captured decode steps run
    our decode attention, and every other batch FlashInfer's."""
    llm = LLM(str(require_weights(models_dir / SMOLLM2)), dtype=torch.bfloat16, device="cuda",
              max_running_req=8, max_seq_len_override=512, num_page_override=4096)
    try:
        backend = llm.backend.scheduler.engine.attn_backend
        assert isinstance(backend, CustomDecodeAttention)
        assert isinstance(backend.backend, FlashInferBackend)
    finally:
        llm.shutdown()


def test_our_attention_at_five_requests_gives_the_same_tokens_up_to_near_ties(models_dir):
    """Five prompts: decode steps replay the graph of 8, where our decode attention sums in
    another order than FlashInfer's, a last bit of bfloat16 apart; no GEMV runs. SmolLM2's
    tokens may differ only where transformers in float32 sees a near tie."""
    path = require_weights(models_dir / SMOLLM2)
    assert_same_up_to_near_ties(path, FIVE_PROMPTS,
                                generate(path, torch.bfloat16, "off", FIVE_PROMPTS),
                                generate(path, torch.bfloat16, "auto", FIVE_PROMPTS), "attention")


def test_sample_on_the_gpu_draws_what_the_reference_draws(on_gpu):
    """Qwen3's vocabulary (75 spans of the kernel's blocks a row), sampled rows beside a greedy
    one: the GPU's tokens are the reference's, token for token (the same float32 keys, logf on
    both sides)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(6, 151_936, device="cuda", generator=gen) * 3).bfloat16()
    temperatures = [0.6, 1.0, 0.0, 0.05, 2.0, 0.6]
    out = cuda_kernels.sample(logits, torch.tensor(temperatures, device="cuda"), 2**40 + 1, 9)
    assert out is not None
    assert out.tolist() == gumbel_max_reference(logits.cpu(), temperatures, 2**40 + 1, 9)


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_gated_gemv_matches_the_matmul_and_activation(on_gpu, rows):
    """Qwen3-0.6B's gate_up_proj (2 x 3,072 rows of 1,024) and the activation, against cuBLAS
    and FlashInfer's silu_and_mul: a last bit or two of bfloat16 apart."""
    from minisgl.kernel import silu_and_mul

    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 1024, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.randn(6144, 1024, device="cuda", generator=gen, dtype=torch.bfloat16) / 32
    got = cuda_kernels.gemv(x, w, gated=True)
    want = silu_and_mul(torch.nn.functional.linear(x, w))
    assert got is not None and got.shape == (rows, 3072)
    assert torch.allclose(got.float(), want.float(), rtol=2**-6, atol=2**-6)


def test_gemv_decode_gives_the_same_tokens_up_to_near_ties(models_dir):
    """Two prompts: decode steps of 2 rows, whose matmuls the GEMV computes (summed in another
    order than cuBLAS: a last bit of bfloat16 apart). SmolLM2's tokens may differ only where
    transformers in float32 sees a near tie."""
    path = require_weights(models_dir / SMOLLM2)
    prompts = PROMPTS[:2]
    assert_same_up_to_near_ties(path, prompts, generate(path, torch.bfloat16, "off", prompts),
                                generate(path, torch.bfloat16, "auto", prompts), "gemv")
