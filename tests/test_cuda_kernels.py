"""Our CUDA kernels on a machine without a GPU: each kernel's own source runs on the CPU through
the emulator of the CUDA execution model (csrc/cuda_model.h), checked against the reference ops:
random inputs and the edges (an empty batch, one token, ids outside the vocabulary slice, the
pool's last slot). That every kernel compiles for sm_80 and sm_90 with CUDA 13.4 and 12.9 is
test_cuda_toolchains.py's."""

from __future__ import annotations

import re
import shutil
import sys

import numpy as np
import pytest
import torch
from transformers import AutoConfig

import fake_flashinfer
from conftest import TINY_QWEN3
from minisgl.attention import FlashInferBackend
from minisgl.attention.custom_decode import CustomDecodeAttention
from minisgl.core import SamplingParams
from minisgl.kernel import cuda_kernels, jit
from minisgl.kernel.norm import rms_norm
from minisgl.kernel.rotary import apply_rotary_inplace
from minisgl.kvcache import MHAKVPool
from minisgl.llm import LLM
from processes import run_example

CHAPTER = 19


def kernel_bodies(source: str) -> dict[str, str]:
    """Each __global__ function of a kernel source: its name -> its body."""
    bodies = {}
    for match in re.finditer(r"__global__\s+void\s+(\w+)\s*\(", source):
        start = source.index("{", match.end())  # the parameters hold no braces
        depth, end = 0, start
        for end in range(start, len(source)):
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            if depth == 0:
                break
        bodies[match.group(1)] = source[start:end + 1]
    return bodies


@pytest.fixture
def emulate():
    previous = cuda_kernels.set_mode("emulate")
    yield
    cuda_kernels.set_mode(previous)


def qkv_views(tokens: int, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as the attention layer sees them: column slices of one fused projection, so
    their rows lie (q_heads + 2 kv_heads) * head_dim elements apart."""
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    return qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)


@pytest.mark.parametrize("name", jit.KERNELS)
def test_every_kernel_waits_for_the_kernel_before_it_then_lets_the_next_start(name):
    """On a GPU of compute capability 9.0 and later LAUNCH starts every kernel early (PDL,
    cuda_model.h): a kernel that read its input before the wait could see it half written, a
    race that the emulator, whose launches run one after another, never shows."""
    source = (jit.SOURCES / f"{name}.cu").read_text()
    assert "<<<" not in source  # launched through LAUNCH only
    bodies = kernel_bodies(source)
    assert bodies
    for kernel, body in bodies.items():
        assert body.count("wait_for_previous_kernel();") == 1, kernel
        assert body.count("let_next_kernel_start();") == 1, kernel
        assert body.index("wait_for_previous_kernel();") < body.index(
            "let_next_kernel_start();"), kernel


# Rows of 64 and 2,048 bytes take the 16-byte path; 12 bytes the 4-byte one (rows 48 bytes
# apart, k 24 bytes into them); 6 bytes the 2-byte one; 3 bytes the 1-byte one.
@pytest.mark.parametrize("tokens", [0, 1, 7])
@pytest.mark.parametrize("dtype, heads, head_dim", [
    (torch.float32, 2, 8), (torch.bfloat16, 8, 128), (torch.float32, 1, 3),
    (torch.float16, 1, 3), (torch.int8, 1, 3)])
def test_store_kv(emulate, tokens, dtype, heads, head_dim):
    gen = torch.Generator().manual_seed(tokens)
    _, k, v = qkv_views(tokens, 2, heads, head_dim, dtype, gen)
    k, v = k.view(tokens, heads, head_dim), v.view(tokens, heads, head_dim)
    slots = 50
    out_loc = torch.randperm(slots, generator=gen)[:tokens]
    if tokens:
        out_loc[0] = slots - 1  # the last slot of the pool
    k_cache, v_cache = (torch.zeros(slots, heads, head_dim, dtype=dtype) for _ in range(2))
    assert cuda_kernels.store_kv(k_cache, v_cache, out_loc, k, v)
    want_k, want_v = (torch.zeros(slots, heads, head_dim, dtype=dtype) for _ in range(2))
    want_k[out_loc], want_v[out_loc] = k, v
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def reference_gather(weights, ids, vocab_range):
    start, length = vocab_range or (0, len(weights))
    local = ids - start
    inside = (local >= 0) & (local < length)
    return weights[local.clamp(0, length - 1)] * inside[:, None].to(weights.dtype)


@pytest.mark.parametrize("vocab_range", [None, (3, 5)])
@pytest.mark.parametrize("ids", [[], [4], [0, 9, 3, 15, -1, 4, 7, 8, 2]])
@pytest.mark.parametrize("dtype, width", [(torch.float32, 12), (torch.bfloat16, 5)])
def test_masked_gather(emulate, vocab_range, ids, dtype, width):
    gen = torch.Generator().manual_seed(len(ids))
    rows = vocab_range[1] if vocab_range else 10
    weights = torch.randn(rows, width, generator=gen).to(dtype)
    ids = torch.tensor(ids, dtype=torch.int64)
    if vocab_range is None:
        ids = ids.clamp(0, rows - 1)  # without a slice every id is a row of the table
    got = cuda_kernels.masked_gather(weights, ids, vocab_range)
    assert got is not None and torch.equal(got, reference_gather(weights, ids, vocab_range))


def rope_cache(positions: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


# float32: the kernel sums the squares in another order than torch; bfloat16: both round at the
# same places, so they may differ only where a sum in another order crosses a rounding boundary:
# by one step, 2**-7 of the value (8 significant bits). So the error is relative to the value
# (absolute below 1, where a step is smaller still).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs() / want.float().abs().clamp(min=1)).max().item()


# Each lane holds 1, 2 or 4 pairs (head_dim 32 leaves half the lanes idle); a block holds 1, 2,
# 4 or 8 heads (3, 6, 4 and 8 heads in all).
@pytest.mark.parametrize("tokens", [0, 1, 5])
@pytest.mark.parametrize("head_dim, q_heads, kv_heads", [
    (64, 4, 2), (128, 4, 2), (32, 2, 1), (128, 2, 2), (256, 6, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_rope(emulate, tokens, head_dim, q_heads, kv_heads, dtype):
    gen = torch.Generator().manual_seed(head_dim + tokens)
    q, k, _ = qkv_views(tokens, q_heads, kv_heads, head_dim, dtype, gen)
    q_weight, k_weight = ((torch.rand(head_dim, generator=gen) + 0.5).to(dtype) for _ in range(2))
    cache = rope_cache(100, head_dim)
    positions = torch.randint(0, 100, (tokens,), generator=gen)
    if tokens:
        positions[0] = 99  # the table's last row
    if tokens == 0:  # nothing to compute (the reference's reshapes cannot even express it)
        assert cuda_kernels.qk_norm_rope(positions, q, k, head_dim, q_weight, k_weight, 1e-6,
                                         cache)
        return
    want_q = rms_norm(q.reshape(tokens, q_heads, head_dim), q_weight, 1e-6).flatten(1)
    want_k = rms_norm(k.reshape(tokens, kv_heads, head_dim), k_weight, 1e-6).flatten(1)
    apply_rotary_inplace(positions, want_q, want_k, head_dim, cache)
    assert cuda_kernels.qk_norm_rope(positions, q, k, head_dim, q_weight, k_weight, 1e-6, cache)
    for got, want in ((q, want_q), (k, want_k)):
        assert relative_error(got, want) <= TOLERANCE[dtype]


def test_qk_norm_rope_declines_a_head_size_it_is_not_written_for(emulate):
    """head_dim 96: not a power of two (the kernel is compiled for 1, 2 or 4 pairs per lane).
    The kernel refuses, and the op falls back to the reference ops."""
    from minisgl.kernel import qk_norm_rope

    gen = torch.Generator().manual_seed(0)
    q, k, _ = qkv_views(3, 2, 1, 96, torch.float32, gen)
    weights, cache, positions = torch.ones(96), rope_cache(10, 96), torch.tensor([0, 4, 9])
    before = q.clone()
    assert not cuda_kernels.qk_norm_rope(positions, q, k, 96, weights, weights, 1e-6, cache)
    assert torch.equal(q, before)  # untouched
    got_q, _ = qk_norm_rope(positions, q, k, 96, cache, weights, weights, 1e-6)
    want_q = rms_norm(before.view(3, 2, 96), weights, 1e-6).flatten(1)
    apply_rotary_inplace(positions, want_q, torch.zeros(3, 0), 96, cache)
    assert torch.allclose(got_q, want_q)


# --- sampling: a reference of the kernel's arithmetic, from the Philox paper, in numpy ---

PHILOX_MULTIPLIERS, PHILOX_KEY_STEPS = (0xD2511F53, 0xCD9E8D57), (0x9E3779B9, 0xBB67AE85)


def philox(counter: list, key: tuple[int, int]) -> list[np.ndarray]:
    """Philox4x32-10 of Salmon et al. (SC'11) on arrays of counters (four uint32 words)."""
    low = np.uint64(0xFFFFFFFF)
    c = [np.asarray(word, dtype=np.uint64) for word in counter]
    k0, k1 = key
    for _ in range(10):
        p0, p1 = np.uint64(PHILOX_MULTIPLIERS[0]) * c[0], np.uint64(PHILOX_MULTIPLIERS[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & low,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & low]
        k0, k1 = (k0 + PHILOX_KEY_STEPS[0]) & 0xFFFFFFFF, (k1 + PHILOX_KEY_STEPS[1]) & 0xFFFFFFFF
    return [word.astype(np.uint32) for word in c]


def gumbel_max_reference(logits: torch.Tensor, temperatures: list[float], seed: int,
                         draw: int) -> list[int]:
    """What the kernel computes, written out: key = logit / T - log(-log u) in float32, with u
    from Philox over (column // 4, row, draw) under the seed; argmax of the keys."""
    rows, vocab = logits.shape
    values = logits.float().numpy()
    col = np.arange(vocab)
    tokens = []
    for row, t in enumerate(temperatures):
        if t == 0:
            tokens.append(int(logits[row].float().argmax()))
            continue
        words = philox([col // 4, np.full(vocab, row), np.full(vocab, draw & 0xFFFFFFFF),
                        np.full(vocab, draw >> 32)], (seed & 0xFFFFFFFF, seed >> 32))
        bits = np.choose(col % 4, words)
        u = ((bits >> 8).astype(np.float32) + np.float32(0.5)) * np.float32(1 / 16777216)
        inv_t = np.float32(1) / np.float32(t)
        keys = values[row] * inv_t - np.log(-np.log(u))
        tokens.append(int(np.argmax(keys)))
    return tokens


def test_the_philox_reference_gives_the_published_answers():
    """Known-answer vectors of Random123, the paper's implementation: counter and key all 0,
    all ones, and the digits of pi."""
    ones = 0xFFFFFFFF
    for counter, key, expected in [
            ([0, 0, 0, 0], (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
            ([ones] * 4, (ones, ones), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
            ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0),
             [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])]:
        assert [int(word) for word in philox(counter, key)] == expected


def test_gumbel_max_draws_follow_the_softmax():
    """The trick itself: 40,000 draws of the reference from one row of 6 logits at T = 0.7 land
    on each token as often as softmax(logits / T) says (within 4 standard deviations)."""
    logits = torch.tensor([[1.0, 0.5, -0.3, 2.0, 0.0, -1.5]]).expand(40_000, 6)
    drawn = gumbel_max_reference(logits, [0.7] * 40_000, seed=11, draw=3)
    counts = np.bincount(drawn, minlength=6)
    p = torch.softmax(logits[0] / 0.7, dim=-1).numpy()
    assert np.all(np.abs(counts - 40_000 * p) <= 4 * np.sqrt(40_000 * p * (1 - p)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("draw, vocab", [(0, 1001), (7, 1001), (2**33 + 5, 1001),
                                         (3, 2 * cuda_kernels.SAMPLE_SPAN + 5)])
def test_sample_draws_what_the_reference_draws(emulate, dtype, draw, vocab):
    """The emulated kernel against the reference, token for token: rows of temperature 0
    (greedy) beside sampled ones, a vocabulary that is no multiple of 4, a 64-bit seed, rows
    of a wider tensor (a slice of the columns), and rows that three blocks share (spans)."""
    gen = torch.Generator().manual_seed(draw % 1000)
    logits = (torch.randn(5, vocab + 3, generator=gen) * 3).to(dtype)[:, :vocab]
    temperatures = [0.6, 0.0, 1.0, 2.5, 0.05]
    seed = 2**40 + 3
    out = cuda_kernels.sample(logits, torch.tensor(temperatures), seed, draw)
    assert out is not None and out.dtype == torch.int32
    assert out.tolist() == gumbel_max_reference(logits, temperatures, seed, draw)


def test_sample_greedy_rows_pick_what_argmax_picks(emulate):
    """Temperature 0: the first of equal largest logits, a NaN ahead of any number, and a row
    of -inf gives token 0, as torch.argmax."""
    inf, nan = float("inf"), float("nan")
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [-inf] * 5, [0.0, 1.0, nan, 5.0, nan],
                           [inf, 0.0, inf, -inf, 1.0]])
    out = cuda_kernels.sample(logits, torch.zeros(4), seed=0, draw=0)
    assert out is not None and out.tolist() == logits.argmax(dim=-1).tolist() == [1, 0, 2, 0]


def test_sample_greedy_rows_across_spans_pick_what_argmax_picks(emulate):
    """Rows longer than a block's span: the spans' best meet in the merge in argmax's order
    (the largest in the last span, a tie across spans goes to the first, a NaN in the middle
    span ahead of larger numbers, all -inf)."""
    span, inf, nan = cuda_kernels.SAMPLE_SPAN, float("inf"), float("nan")
    logits = torch.zeros(4, 2 * span + 9)
    logits[0, 2 * span + 7] = 1.0
    logits[1, [span - 1, span, 2 * span]] = 2.0
    logits[2, span + 3], logits[2, 2 * span + 1] = nan, inf
    logits[3] = -inf
    out = cuda_kernels.sample(logits, torch.zeros(4), seed=0, draw=0)
    want = [2 * span + 7, span - 1, span + 3, 0]
    assert out is not None and out.tolist() == logits.argmax(dim=-1).tolist() == want


def test_sample_a_new_draw_number_draws_anew(emulate):
    logits = torch.zeros(3, 64)  # uniform over 64 tokens: the uniforms alone decide
    temperatures = torch.ones(3)
    first = cuda_kernels.sample(logits, temperatures, seed=5, draw=0).tolist()
    assert cuda_kernels.sample(logits, temperatures, seed=5, draw=0).tolist() == first
    assert cuda_kernels.sample(logits, temperatures, seed=5, draw=1).tolist() != first
    assert cuda_kernels.sample(logits, temperatures, seed=6, draw=0).tolist() != first
    assert len(set(first)) > 1  # the rows draw apart


@pytest.mark.parametrize("logits, temperatures", [
    (torch.zeros(2, 8, dtype=torch.float16), torch.ones(2)),  # a dtype it is not built for
    (torch.zeros(8, 2).t(), torch.ones(2)),  # columns not contiguous
    (torch.zeros(2, 8), torch.ones(3)),  # a temperature per row, no more
    (torch.zeros(2, 8), torch.ones(2, dtype=torch.float64)),
    (torch.zeros(2, 0), torch.ones(2)),  # nothing to draw from
])
def test_sample_declines_tensors_it_does_not_take(emulate, logits, temperatures):
    assert cuda_kernels.sample(logits, temperatures, seed=0, draw=0) is None


def test_the_sampler_draws_with_the_kernel_unless_a_request_filters(emulate):
    """Sampler.sample: the kernel for temperatures alone (each call a new draw number), the
    reference ops when top-k or top-p filters; greedy batches never reach either."""
    from minisgl.engine.sampler import Sampler, SamplingArgs

    sampler = Sampler(torch.device("cpu"), vocab_size=32, seed=9)
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    temperatures = torch.tensor([0.8, 0.0, 1.3, 0.5])
    first = sampler.sample(logits, SamplingArgs(temperatures, None, None))
    assert sampler.draws == 1
    assert first.tolist() == gumbel_max_reference(logits, temperatures.tolist(), 9, 0)
    second = sampler.sample(logits, SamplingArgs(temperatures, None, None))
    assert sampler.draws == 2
    assert second.tolist() == gumbel_max_reference(logits, temperatures.tolist(), 9, 1)
    top_k, top_p = torch.full((4,), 32), torch.ones(4)
    filtered = sampler.sample(logits, SamplingArgs(temperatures, top_k, top_p))
    assert sampler.draws == 2 and filtered[1] == logits[1].argmax()
    assert sampler.sample(logits, None).tolist() == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [8, 64, 264, 2056])
def test_gemv(emulate, rows, k):
    """x @ w.T for 1-4 rows; x is a slice of a wider tensor (rows further apart than k), and
    n_out = 10 leaves the last block's fourth warp without a column; k = 264 gives some lanes
    two pieces; k = 2,056 splits each row over four warps, whose sums meet in shared memory.
    Summed in float32 in another order than the reference and rounded once: within a last bit
    of bfloat16 (2**-7 of the value, or absolute below 1)."""
    gen = torch.Generator().manual_seed(rows * k)
    x = torch.randn(rows, k + 8, generator=gen).bfloat16()[:, :k]
    w = torch.randn(10, k, generator=gen).bfloat16()
    out = cuda_kernels.gemv(x, w)
    want = x.double() @ w.double().T
    assert out is not None and out.shape == (rows, 10) and out.dtype == torch.bfloat16
    error = ((out.double() - want).abs() / want.abs().clamp(min=1)).max().item()
    assert error <= 2**-7


def decode_case(lengths: list[int], q_heads: int, kv_heads: int, head_dim: int,
                dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """A pool, a page table whose rows hold scattered slots, and one decode token a request
    (at position length - 1, its slot still holding another token's K and V)."""
    gen = torch.Generator().manual_seed(seed)
    slots, width = 4 * sum(lengths) + 8, max(lengths) + 5
    k_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    page_table = torch.randperm(slots, generator=gen)[: len(lengths) * width].int()
    page_table = page_table.view(-1, width)
    rows = torch.arange(len(lengths) - 1, -1, -1)  # request i in row n - 1 - i
    positions = torch.tensor(lengths, dtype=torch.int64) - 1
    tensors = [t.to(device) for t in (k_cache, v_cache, page_table, rows, positions)]
    q, k, v = (t.to(device) for t in qkv_views(len(lengths), q_heads, kv_heads, head_dim, dtype,
                                               gen))
    return dict(q=q.view(-1, q_heads, head_dim), k=k.view(-1, kv_heads, head_dim),
                v=v.view(-1, kv_heads, head_dim), k_cache=tensors[0], v_cache=tensors[1],
                page_table=tensors[2], rows=tensors[3], positions=tensors[4],
                out_loc=tensors[2][tensors[3], tensors[4]].long())


def reference_decode_attention(case: dict, scale: float) -> torch.Tensor:
    """In float64 on the CPU: each request's cached keys from the pool, then its new one."""
    case = {name: t.cpu() for name, t in case.items()}
    outs = []
    for i, (row, position) in enumerate(zip(case["rows"], case["positions"])):
        cached = case["page_table"][row, :position].long()
        keys = torch.cat([case["k_cache"][cached], case["k"][i: i + 1]]).double()
        values = torch.cat([case["v_cache"][cached], case["v"][i: i + 1]]).double()
        group = case["q"].shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("hd,thd->ht", case["q"][i].double(), keys) * scale
        outs.append(torch.einsum("ht,thd->hd", scores.softmax(-1), values))
    return torch.stack(outs)


def plan_and_attend(case: dict, scale: float, items_per_wave: int,
                    min_chunk: int = 1) -> tuple[torch.Tensor | None, tuple]:
    """A step as a decode graph runs it: the plan from the positions, then the attention."""
    q_heads, kv_heads, head_dim = case["q"].shape[1], case["k"].shape[1], case["q"].shape[2]
    n = len(case["positions"])
    scratch = cuda_kernels.decode_attention_scratch(n, items_per_wave, q_heads, kv_heads,
                                                    head_dim, case["q"].device)
    assert cuda_kernels.decode_attention_plan(case["positions"], items_per_wave, scratch,
                                              min_chunk)
    return cuda_kernels.decode_attention(**case, scale=scale, items_per_wave=items_per_wave,
                                         scratch=scratch), scratch


def plan_items(plan: torch.Tensor) -> list[tuple[int, ...]]:
    """The plan's items: (request, chunk, chunks of the request, its first item)."""
    header = cuda_kernels.DECODE_ATTENTION_PLAN_HEADER
    return [tuple(item) for item in plan[header: header + 4 * int(plan[0])].view(-1, 4).tolist()]


@pytest.mark.parametrize("lengths, items_per_wave, min_chunk, chunks", [
    ([100] * 4, 8, 1, [2] * 4),  # one wave: 8 chunks of 50
    ([100, 10, 10, 10], 4, 1, [5, 1, 1, 1]),  # one wave of 4 would idle: two waves (8)
    ([64, 9, 64, 20, 1], 4, 1, [2, 1, 2, 1, 1]),  # more requests than a wave; ties in order
    ([64, 9, 64, 20, 1], 4, 64, [1] * 5),  # at least 64 tokens a chunk
    ([3000], 1000, 1, [64]),  # at most DECODE_ATTENTION_MAX_SPLITS a request
    (list(range(1, 301)), 250, 1, [1] * 150 + [2] * 150)])  # two tiles of lengths
def test_decode_attention_plan_cuts_a_wave_longest_first(emulate, lengths, items_per_wave,
                                                          min_chunk, chunks):
    """The finest cut (of the longest context into k chunks) whose chunks fit one wave, or
    two where one would idle more than a quarter of its time; longest request first (ties in
    batch order), each request's chunks together and numbered, its first item where they
    start; no more items than decode_attention_max_items. 300 requests are more than the
    plan's 256 threads: a thread places two, a tile of lengths at a time."""
    positions = torch.tensor(lengths) - 1
    scratch = cuda_kernels.decode_attention_scratch(len(lengths), items_per_wave, 2, 1, 64,
                                                    torch.device("cpu"))
    assert cuda_kernels.decode_attention_plan(positions, items_per_wave, scratch, min_chunk)
    order = sorted(range(len(lengths)), key=lambda r: (-lengths[r], r))
    want, first = [], 0
    for r in order:
        want += [(r, c, chunks[r], first) for c in range(chunks[r])]
        first += chunks[r]
    assert plan_items(scratch[2]) == want
    assert len(want) <= cuda_kernels.decode_attention_max_items(len(lengths), items_per_wave)


@pytest.mark.parametrize("dtype, q_heads, kv_heads, head_dim", [
    (torch.float32, 4, 2, 64), (torch.bfloat16, 16, 8, 128), (torch.float32, 3, 3, 256),
    (torch.bfloat16, 9, 3, 64), (torch.float32, 8, 4, 32)])
@pytest.mark.parametrize("lengths, items_per_wave", [
    ([1], 1), ([1], 4), ([37], 1), ([37], 5), ([9, 1, 64, 20], 3), ([100, 3], 16),
    ([600], 64)])
def test_decode_attention(emulate, dtype, q_heads, kv_heads, head_dim, lengths,
                          items_per_wave):
    """Cut into chunks as planned (one token a chunk at most), merged by the last chunk to
    finish; the new K and V stored at out_loc; the counters left at zero, so that a second
    launch (a graph's replay) gives the same result."""
    case = decode_case(lengths, q_heads, kv_heads, head_dim, dtype,
                       seed=sum(lengths) + items_per_wave)
    scale = head_dim ** -0.5
    want = reference_decode_attention(case, scale)
    out, scratch = plan_and_attend(case, scale, items_per_wave)
    assert out is not None and out.shape == case["q"].shape and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7  # one rounding to bfloat16
    assert (out.double() - want).abs().max().item() <= tolerance * max(1, want.abs().max())
    assert torch.equal(case["k_cache"][case["out_loc"]], case["k"])
    assert torch.equal(case["v_cache"][case["out_loc"]], case["v"])
    assert not scratch[1].any()
    again = cuda_kernels.decode_attention(**case, scale=scale, items_per_wave=items_per_wave,
                                          scratch=scratch)
    assert again is not None and torch.equal(again, out)


def test_decode_attention_declines_what_it_does_not_take(emulate):
    case = decode_case([5, 6], 4, 2, 64, torch.float32, seed=0)
    cpu = torch.device("cpu")
    scratch = cuda_kernels.decode_attention_scratch(2, 3, 4, 2, 64, cpu)
    assert cuda_kernels.decode_attention_plan(case["positions"], 3, scratch)
    assert cuda_kernels.decode_attention(**case, scale=0.1, items_per_wave=3,
                                         scratch=scratch) is not None
    small = cuda_kernels.decode_attention_scratch(2, 2, 4, 2, 64, cpu)  # room for 4 items, not 6
    assert not cuda_kernels.decode_attention_plan(case["positions"], 3, small)
    assert cuda_kernels.decode_attention(**case, scale=0.1, items_per_wave=3, scratch=small) is None
    for positions, items_per_wave, min_chunk in [(case["positions"].int(), 3, 1),
                                               (case["positions"][:0], 3, 1),
                                               (case["positions"], 0, 1),
                                               (case["positions"], 3, 0)]:
        assert not cuda_kernels.decode_attention_plan(positions, items_per_wave, scratch,
                                                      min_chunk)
    for name, bad in [("page_table", case["page_table"].long()),
                      ("positions", case["positions"].int()),
                      ("k_cache", case["k_cache"].transpose(0, 1).contiguous().transpose(0, 1))]:
        assert cuda_kernels.decode_attention(**(case | {name: bad}), scale=0.1, items_per_wave=3,
                                             scratch=scratch) is None, name
    odd = decode_case([5], 2, 1, 48, torch.float32, seed=0)  # a head size it is not built for
    assert cuda_kernels.decode_attention(**odd, scale=0.1, items_per_wave=3,
                                         scratch=scratch) is None


def test_decode_attention_blocks_per_sm_in_the_emulator_and_for_heads_it_lacks():
    """The emulator runs one block at a time; a build that does not exist is an error, not a
    zero that would make the backend cut no chunks."""
    cpu = torch.device("cpu")
    assert cuda_kernels.decode_attention_blocks_per_sm(16, 8, 128, torch.bfloat16, cpu) == 1
    for q_heads, kv_heads, head_dim in [(10, 2, 128), (4, 2, 48), (3, 2, 64)]:
        with pytest.raises(ValueError, match="no build"):
            cuda_kernels.decode_attention_blocks_per_sm(q_heads, kv_heads, head_dim,
                                                        torch.float32, cpu)
    with pytest.raises(ValueError, match="computes in"):
        cuda_kernels.decode_attention_blocks_per_sm(4, 2, 64, torch.float16, cpu)


def bf16_zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.bfloat16)



@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("k", [64, 2056])
def test_gemv_gated(emulate, rows, k):
    """SwiGLU's gate_up_proj and activation in one launch: w = [gate; up] (2 x 5 rows), out
    [rows, 5] = silu(x @ gate.T) * (x @ up.T), each product rounded to bfloat16 first as the
    matmul rounds it; k = 2,056 takes the four-warp split. Against the two reference ops:
    within a last bit or two of bfloat16 (the sums in another order, expf on the device)."""
    from minisgl.kernel import silu_and_mul

    gen = torch.Generator().manual_seed(rows + k)
    x = torch.randn(rows, k + 8, generator=gen).bfloat16()[:, :k]
    w = (torch.randn(10, k, generator=gen) / k ** 0.5).bfloat16()
    out = cuda_kernels.gemv(x, w, gated=True)
    want = silu_and_mul(torch.nn.functional.linear(x, w))
    assert out is not None and out.shape == (rows, 5) and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), want.float(), rtol=2**-6, atol=2**-6)
    swapped = torch.cat([w[5:], w[:5]])  # up first: a different answer, so the halves matter
    assert not torch.allclose(cuda_kernels.gemv(x, swapped, gated=True).float(), out.float(),
                              rtol=2**-6, atol=2**-6)
    assert cuda_kernels.gemv(x, w[:9], gated=True) is None  # no even split into gate and up

@pytest.mark.parametrize("x, w", [
    (bf16_zeros(5, 64), bf16_zeros(10, 64)),  # more rows than the decode batches it is for
    (bf16_zeros(2, 60), bf16_zeros(10, 60)),  # k not in whole 16-byte pieces
    (bf16_zeros(2, 64), bf16_zeros(64, 10).t()),  # the weight transposed: not contiguous
    (bf16_zeros(2, 64), torch.zeros(10, 64)),  # dtypes differ
    (torch.zeros(2, 64), torch.zeros(10, 64)),  # float32: the CPU's, left to the reference
    (bf16_zeros(2, 65)[:, 1:], bf16_zeros(10, 64)),  # rows not 16-byte aligned
    (bf16_zeros(2, 64), bf16_zeros(10, 32)),  # k differs
])
def test_gemv_declines_tensors_it_does_not_take(emulate, x, w):
    assert cuda_kernels.gemv(x, w) is None


def test_linear_takes_the_gemv_for_a_few_bfloat16_rows_only(emulate, monkeypatch):
    """kernel.linear: the GEMV for 1-4 rows of bfloat16 (the bias added after it), F.linear for
    more rows and for float32, whose results it returns unchanged."""
    from minisgl.kernel import linear

    calls = []
    real = cuda_kernels.gemv
    monkeypatch.setattr(cuda_kernels, "gemv",
                        lambda x, w, **kw: calls.append(len(x)) or real(x, w, **kw))
    gen = torch.Generator().manual_seed(0)
    w, bias = torch.randn(12, 64, generator=gen), torch.randn(12, generator=gen)
    for rows, dtype in [(3, torch.bfloat16), (5, torch.bfloat16), (3, torch.float32)]:
        x = torch.randn(rows, 64, generator=gen)
        xd, wd, bd = x.to(dtype), w.to(dtype), bias.to(dtype)
        got, want = linear(xd, wd, bd), torch.nn.functional.linear(xd, wd, bd)
        if dtype == torch.float32 or rows > 4:
            assert torch.equal(got, want)
        else:  # float32 sums rounded once, then the bias: a last bit or two of bfloat16
            assert torch.allclose(got.float(), want.float(), rtol=2**-6, atol=2**-6)
    assert calls == [3, 5, 3]  # asked every time; it declined 5 rows and float32


@pytest.fixture
def no_kernel(monkeypatch):
    """Fails a test whose wrapper goes on to load a kernel library (it should have declined)."""
    def refuse(name, device):
        raise AssertionError(f"the {name} kernel was reached")
    monkeypatch.setattr(cuda_kernels, "_library", refuse)


STORE_MISMATCHES = {  # (out_loc, k, v) against a pool of 50 slots of 2 heads x 8
    "more slots than rows": ([1, 2, 3, 4], (3, 2, 8), (3, 2, 8)),
    "fewer slots than rows": ([1, 2], (3, 2, 8), (3, 2, 8)),
    "k rows shorter than the pool's": ([1, 2, 3], (3, 2, 4), (3, 2, 4)),
    "v rows longer than k's": ([1, 2, 3], (3, 2, 8), (3, 2, 16)),
}


@pytest.mark.parametrize("case", STORE_MISMATCHES)
def test_store_kv_declines_shapes_that_do_not_match(emulate, no_kernel, case):
    """The kernel trusts the sizes it is given: a mismatch would read or write past a row.
    The wrapper declines before any launch, and the op's reference raises torch's error."""
    from minisgl.kernel.store import store_kv

    slots, k_shape, v_shape = STORE_MISMATCHES[case]
    k_cache, v_cache = torch.zeros(50, 2, 8), torch.zeros(50, 2, 8)
    out_loc, k, v = torch.tensor(slots), torch.randn(k_shape), torch.randn(v_shape)
    assert not cuda_kernels.store_kv(k_cache, v_cache, out_loc, k, v)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        store_kv(k_cache, v_cache, out_loc, k, v)


def test_masked_gather_declines_a_slice_longer_than_the_table(emulate, no_kernel):
    assert cuda_kernels.masked_gather(torch.randn(5, 4), torch.tensor([3, 9]), (3, 8)) is None


QK_MISMATCHES = {  # (tokens of q and k, positions, weight length) with head_dim 8
    "fewer positions than tokens": ((3, 3), 2, 8),
    "k of other tokens than q": ((3, 2), 3, 8),
    "weights of another length": ((3, 3), 3, 4),
}


@pytest.mark.parametrize("case", QK_MISMATCHES)
def test_qk_norm_rope_declines_shapes_that_do_not_match(emulate, no_kernel, case):
    from minisgl.kernel import qk_norm_rope

    (q_tokens, k_tokens), positions, weight = QK_MISMATCHES[case]
    q, k = torch.randn(q_tokens, 2 * 8), torch.randn(k_tokens, 8)
    args = (torch.arange(positions), q, k, 8)
    weights, cache = torch.ones(weight), rope_cache(10, 8)
    assert not cuda_kernels.qk_norm_rope(*args, weights, weights, 1e-6, cache)
    with pytest.raises(RuntimeError):
        qk_norm_rope(*args, cache, weights, weights, 1e-6)


def test_qk_norm_rope_declines_rows_that_are_not_whole_heads(emulate, no_kernel):
    """q of 20 columns with head_dim 8: two heads and a half."""
    q, k, weights = torch.randn(3, 20), torch.randn(3, 8), torch.ones(8)
    assert not cuda_kernels.qk_norm_rope(torch.arange(3), q, k, 8, weights, weights, 1e-6,
                                         rope_cache(10, 8))


def test_the_emulator_runs_the_kernels_own_source(emulate, tmp_path, monkeypatch):
    """A bug planted in store.cu's index arithmetic (each token written one slot further) shows
    in the emulated result: the CPU test executes the kernel source, not a Python copy of it."""
    sources = tmp_path / "csrc"
    shutil.copytree(jit.SOURCES, sources)
    text = (sources / "store.cu").read_text()
    assert text.count("slot * row_units") == 2
    (sources / "store.cu").write_text(text.replace("slot * row_units", "(slot + 1) * row_units"))
    monkeypatch.setattr(jit, "SOURCES", sources)
    monkeypatch.setattr(jit, "CACHE_DIR", tmp_path / "cache")
    cuda_kernels._library.cache_clear()  # libraries kept loaded, per process
    try:
        k_cache, v_cache = torch.zeros(4, 2), torch.zeros(4, 2)
        k = torch.ones(1, 2)
        assert cuda_kernels.store_kv(k_cache, v_cache, torch.tensor([1]), k, k)
        assert torch.equal(k_cache[2], k[0]) and not k_cache[1].any()  # the planted bug, executed
    finally:
        cuda_kernels._library.cache_clear()


def test_a_library_is_built_once_and_then_taken_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "CACHE_DIR", tmp_path)
    calls = []
    real = jit.run_compiler
    monkeypatch.setattr(jit, "run_compiler", lambda command: (calls.append(command), real(command)))
    first = jit.build("index", "emulator")
    assert jit.build("index", "emulator") == first and len(calls) == 1


def test_a_new_compiler_or_new_flags_build_anew(tmp_path, monkeypatch):
    """The cache key is the sources, the compile command's flags and the compiler's version:
    an upgraded compiler or a changed flag must not load a library built the old way."""
    monkeypatch.setattr(jit, "CACHE_DIR", tmp_path)
    first = jit.build("index", "emulator")
    monkeypatch.setattr(jit, "compiler_version", lambda compiler: "c++ (another) 99.0")
    second = jit.build("index", "emulator")
    command = jit.compile_command
    monkeypatch.setattr(jit, "compile_command", lambda *a: [*command(*a), "-DNDEBUG"])
    third = jit.build("index", "emulator")
    assert len({first, second, third}) == 3 and all(p.is_file() for p in (first, second, third))


def test_the_same_sources_elsewhere_share_the_build(tmp_path, monkeypatch):
    """Only the sources' text is in the key, not where they sit: another checkout of the same
    files (a chapter's tree built by tools/steps.py) reuses the build."""
    monkeypatch.setattr(jit, "CACHE_DIR", tmp_path / "cache")
    first = jit.build("index", "emulator")
    shutil.copytree(jit.SOURCES, tmp_path / "csrc")
    monkeypatch.setattr(jit, "SOURCES", tmp_path / "csrc")
    assert jit.build("index", "emulator") == first


def test_the_mode_is_checked():
    with pytest.raises(ValueError, match="mode must be one of"):
        cuda_kernels.set_mode("on")
    from minisgl.engine import EngineConfig

    with pytest.raises(ValueError, match="custom_kernels must be auto, off or emulate"):
        EngineConfig("m", custom_kernels="yes")


def test_the_server_flag_turns_them_off():
    from minisgl.server.args import parse_args

    port = ["--port", "0"]  # any free port: another server may hold the default 1919
    args = parse_args(["--model", "models/tiny-qwen3", "--disable-custom-kernels", *port])
    assert args.scheduler.custom_kernels == "off"
    assert parse_args(["--model", "models/tiny-qwen3", *port]).scheduler.custom_kernels == "auto"


def test_tiny_qwen3_with_emulated_kernels_equals_the_reference_ops(models_dir, hf_model,
                                                                  hf_tokenizer, hf_greedy,
                                                                  monkeypatch):
    """The whole model through the kernels' CPU build (store, gather, and Qwen3's fused q/k
    norm + RoPE): the same greedy tokens as the reference ops and as transformers. Each of the
    three answers every call (none declines the model's tensors and leaves them to the
    reference)."""
    answers = {}  # op -> whether each call ran the kernel

    def record(op, result):
        answers.setdefault(op, set()).add(result is not None and result is not False)
        return result

    for op in ("store_kv", "masked_gather", "qk_norm_rope"):
        real = getattr(cuda_kernels, op)
        monkeypatch.setattr(cuda_kernels, op,
                            lambda *a, _op=op, _real=real: record(_op, _real(*a)))
    prompts = ["The capital of France is", "def fibonacci(n):"]
    outs = {}
    for mode in ("emulate", "off"):
        llm = LLM(str(models_dir / TINY_QWEN3), custom_kernels=mode, max_running_req=2,
                  num_page_override=128, max_seq_len_override=64)
        try:
            outs[mode] = [o["token_ids"] for o in llm.generate(
                prompts, SamplingParams(max_tokens=8, ignore_eos=True), progress=False)]
        finally:
            llm.shutdown()
    hf, tokenizer = hf_model(TINY_QWEN3), hf_tokenizer(TINY_QWEN3)
    expected = [hf_greedy(hf, tokenizer(p).input_ids, 8) for p in prompts]
    assert outs["emulate"] == outs["off"] == expected
    assert answers == {"store_kv": {True}, "masked_gather": {True}, "qk_norm_rope": {True}}


def test_small_decode_graphs_replay_our_attention_kernel(models_dir, monkeypatch, hf_model,
                                                        hf_tokenizer, hf_greedy):
    """The FlashInfer backend (the fake package) with emulated graphs and kernels: every
    captured decode step replays our kernel, which stores and attends, in place of store_kv
    and FlashInfer's decode (three requests replay the graph of 4); the tokens stay
    transformers' greedy. Each replayed step plans its chunks once, from the graph's
    positions, for all of its layers. FlashInfer's graph state (a 128 MiB workspace,
    page-index buffers) is never built."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)
    monkeypatch.setattr(FlashInferBackend, "unsupported_reason",
                        classmethod(lambda cls, *args: None))
    launches, plans = [], []
    real_attention, real_plan = cuda_kernels.decode_attention, cuda_kernels.decode_attention_plan

    def decode_attention(q, *args):
        launches.append(len(q))
        return real_attention(q, *args)

    def decode_attention_plan(positions, *args):
        plans.append(len(positions))
        return real_plan(positions, *args)

    monkeypatch.setattr(cuda_kernels, "decode_attention", decode_attention)
    monkeypatch.setattr(cuda_kernels, "decode_attention_plan", decode_attention_plan)
    prompts = ["The capital of France is", "def fibonacci(n):", "List three colors:"]
    llm = LLM(str(models_dir / TINY_QWEN3), attention_backend="flashinfer", cuda_graph="emulate",
              custom_kernels="emulate", max_running_req=4, num_page_override=128,
              max_seq_len_override=64, page_size=4)
    try:
        outs = [o["token_ids"] for o in llm.generate(
            prompts, SamplingParams(max_tokens=8, ignore_eos=True), progress=False)]
        backend = llm.backend.scheduler.engine.attn_backend
        assert isinstance(backend, CustomDecodeAttention)
        assert isinstance(backend.backend, FlashInferBackend)
        assert not hasattr(backend.backend, "graph_workspace")
    finally:
        llm.shutdown()
    tokenizer = hf_tokenizer(TINY_QWEN3)
    assert outs == [hf_greedy(hf_model(TINY_QWEN3), tokenizer(p).input_ids, 8) for p in prompts]
    # The captured sizes; the graph of 4 for the three requests, padded.
    assert set(launches) <= {1, 2, 4} and 4 in launches
    layers = AutoConfig.from_pretrained(models_dir / TINY_QWEN3).num_hidden_layers
    assert sorted(launches) == sorted(size for size in plans for _ in range(layers))


@pytest.mark.parametrize("mode,q_heads,kv_heads,head_dim,dtype,takes", [
    ("emulate", 8, 2, 64, torch.float32, True),
    ("emulate", 4, 4, 128, torch.bfloat16, True),
    ("off", 8, 2, 64, torch.float32, False),  # our kernels are off
    ("emulate", 10, 2, 64, torch.float32, False),  # five query heads a KV head
    ("emulate", 8, 2, 96, torch.float32, False),  # no build for the head size
    ("emulate", 8, 2, 64, torch.float16, False),  # nor for the dtype
])
def test_captured_decode_runs_our_attention_only_where_the_kernel_takes_the_model(
        mode, q_heads, kv_heads, head_dim, dtype, takes):
    pool = MHAKVPool(1, 4, 4, kv_heads, head_dim, dtype, torch.device("cpu"))
    previous = cuda_kernels.set_mode(mode)
    try:
        assert CustomDecodeAttention.takes(pool, q_heads) == takes
    finally:
        cuda_kernels.set_mode(previous)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answers are checked here")
def test_example_runs_the_emulated_kernels(hf_example_text):
    out = run_example("ch19_cuda_kernels.py")
    assert re.search(r"^我们的 kernel 与参考算子输出相同： True$", out, re.M)
    assert f"custom_kernels=emulate → {hf_example_text(TINY_QWEN3, 8)!r}" in out
