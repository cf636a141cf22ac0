"""Our own CUDA kernels (chapter 19), each behind a reference op, and decode attention for
captured decode steps. The Engine sets the process-wide mode: "auto" runs them on CUDA tensors,
"emulate" their CPU build (csrc/cuda_model.h) on CPU tensors, "off" none. Tensors a kernel
cannot take go to the reference, which raises where a kernel would read out of bounds (the
kernels trust every size they are given)."""

from __future__ import annotations

import ctypes
from ctypes import c_float, c_int, c_int64, c_uint64, c_void_p
from functools import cache

import torch

from . import jit

MODES = ("auto", "off", "emulate")
_mode = "off"
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # what the fused norm computes in

_SIGNATURES = {
    "minisgl_store_kv": [c_void_p] * 5 + [c_int64] * 4 + [c_void_p],
    "minisgl_masked_gather": [c_void_p] * 3 + [c_int64] * 4 + [c_void_p],
    "minisgl_qk_norm_rope": [c_void_p] * 2 + [c_int64] * 6 + [c_void_p] * 4 + [c_float, c_int,
                                                                             c_void_p],
    "minisgl_sample": [c_void_p] * 2 + [c_int64] + [c_void_p] + [c_int64] * 3 + [c_void_p]
    + [c_uint64] * 2 + [c_int, c_void_p],
    "minisgl_gemv": [c_void_p] * 3 + [c_int64] * 5 + [c_int, c_void_p],
    "minisgl_decode_attention": [c_void_p] * 4 + [c_int64] * 2 + [c_void_p] * 3 + [c_int64]
    + [c_void_p] * 4 + [c_int64] * 4 + [c_float, c_void_p, c_void_p, c_int, c_void_p],
    "minisgl_decode_attention_plan": [c_void_p] * 2 + [c_int64] * 3 + [c_void_p],
    "minisgl_decode_attention_blocks_per_sm": [c_int64] * 3 + [c_int],
}


def set_mode(mode: str) -> str:
    """Switch the process to `mode`; returns the previous one (the Engine puts it back)."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"custom kernels: mode must be one of {MODES}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


def target_for(x: torch.Tensor) -> str | None:
    """The build that runs for tensors like `x` ("cuda" or "emulator"), or None: reference."""
    if _mode == "auto" and x.is_cuda:
        return "cuda"
    if _mode == "emulate" and x.device.type == "cpu":
        return "emulator"
    return None


def prepare(device: torch.device) -> None:
    """Build (or load from the cache) every kernel library for `device` now."""
    for name in jit.KERNELS:
        _library(name, device)


# Cached per process: asking the device again and setting every exported function's types
# again (a name the library lacks is a failed lookup and an exception inside ctypes) is host
# work on every call, and an eager prefill step makes a few calls per layer.
@cache
def _library(name: str, device: torch.device) -> ctypes.CDLL:
    """The library for `device`, with the argument and result types of its functions set: each
    returns 0, or a CUDA error code."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device.index)
        library = ctypes.CDLL(str(jit.build(name, "cuda", f"sm_{major}{minor}")))
    else:
        library = ctypes.CDLL(str(jit.build(name, "emulator")))
    for function, argtypes in _SIGNATURES.items():
        if hasattr(library, function):
            getattr(library, function).argtypes = argtypes
            getattr(library, function).restype = c_int
    return library


def _stream(x: torch.Tensor) -> int | None:
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None


def _check(code: int, kernel: str) -> None:
    if code != 0:
        raise RuntimeError(f"{kernel}: CUDA error {code}")


def _rows(x: torch.Tensor) -> bool:
    """Each row (index along dimension 0) contiguous in memory; rows may lie any distance
    apart (k and v are column slices of the fused qkv projection)."""
    return x.dim() >= 1 and (x.shape[0] == 0 or x[0].is_contiguous())


def _row_numel(x: torch.Tensor) -> int:
    return x.shape[1:].numel()


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> bool:
    """k_cache[out_loc] = k and v_cache[out_loc] = v in one launch; False (nothing done) when
    the tensors are not laid out for the kernel."""
    if not (out_loc.dtype == torch.int64 and out_loc.dim() == 1 and out_loc.is_contiguous()
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and k.dtype == v.dtype == k_cache.dtype == v_cache.dtype and _rows(k) and _rows(v)
            and len(out_loc) == k.shape[0] == v.shape[0]
            and _row_numel(k) == _row_numel(v) == _row_numel(k_cache) == _row_numel(v_cache)):
        return False
    code = _library("store", k.device).minisgl_store_kv(
        k_cache.data_ptr(), v_cache.data_ptr(), out_loc.data_ptr(), k.data_ptr(), v.data_ptr(),
        len(out_loc), _row_numel(k_cache) * k_cache.element_size(),
        k.stride(0) * k.element_size(), v.stride(0) * v.element_size(), _stream(k))
    _check(code, "store_kv")
    return True


def masked_gather(weights: torch.Tensor, ids: torch.Tensor,
                  vocab_range: tuple[int, int] | None) -> torch.Tensor | None:
    """Rows of `weights` for `ids`; with vocab_range = (start, length), ids outside this rank's
    rows give zero rows. None when the tensors are not laid out for the kernel."""
    start, length = vocab_range if vocab_range is not None else (0, len(weights))
    if not (ids.dtype == torch.int64 and ids.dim() == 1 and ids.is_contiguous()
            and weights.dim() >= 1 and weights.is_contiguous() and length <= len(weights)):
        return None  # rows past the table's end would be read where the reference raises
    out = torch.empty(len(ids), *weights.shape[1:], dtype=weights.dtype, device=weights.device)
    code = _library("index", weights.device).minisgl_masked_gather(
        out.data_ptr(), weights.data_ptr(), ids.data_ptr(), len(ids),
        _row_numel(weights) * weights.element_size(), start, length, _stream(weights))
    _check(code, "masked_gather")
    return out


def qk_norm_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos_sin_cache: torch.Tensor) -> bool:
    """In place on q [tokens, q_heads * head_dim] and k [tokens, k_heads * head_dim]: per-head
    RMSNorm (weights q_weight, k_weight), then RoPE from cos_sin_cache [positions, head_dim]
    (float32, cos then sin). False (nothing done) when the kernel does not take these tensors."""
    if not (q.dtype in _DTYPES and q.dtype == k.dtype == q_weight.dtype == k_weight.dtype
            and q.dim() == k.dim() == 2 and q.stride(1) == 1 and k.stride(1) == 1
            and head_dim > 0 and q.shape[1] % head_dim == 0 and k.shape[1] % head_dim == 0
            and positions.dtype == torch.int64 and positions.dim() == 1
            and positions.is_contiguous() and len(positions) == q.shape[0] == k.shape[0]
            and q_weight.shape == k_weight.shape == (head_dim,) and q_weight.is_contiguous()
            and k_weight.is_contiguous() and cos_sin_cache.dtype == torch.float32
            and cos_sin_cache.dim() == 2 and cos_sin_cache.is_contiguous()
            and cos_sin_cache.shape[1] == head_dim):
        return False
    code = _library("qk_norm_rope", q.device).minisgl_qk_norm_rope(
        q.data_ptr(), k.data_ptr(), q.stride(0), k.stride(0), q.shape[0],
        q.shape[1] // head_dim, k.shape[1] // head_dim, head_dim, q_weight.data_ptr(),
        k_weight.data_ptr(), cos_sin_cache.data_ptr(), positions.data_ptr(), eps,
        _DTYPES[q.dtype], _stream(q))
    if code == -1:  # a head size the kernel is not written for
        return False
    _check(code, "qk_norm_rope")
    return True


SAMPLE_SPAN = 2048  # columns of a row one block of sample.cu reads (its kSpan)


def sample(logits: torch.Tensor, temperatures: torch.Tensor, seed: int,
           draw: int) -> torch.Tensor | None:
    """One token per row of logits [rows, vocab] (int32): a Gumbel-max draw from
    softmax(row / temperature), the argmax where it is 0, its noise a function of (seed, draw,
    row, column). None when the kernel does not take these tensors."""
    if not (logits.dtype in _DTYPES and logits.dim() == 2 and logits.stride(1) == 1
            and 0 < logits.shape[1] <= 65535 * SAMPLE_SPAN  # a grid dimension of spans
            and temperatures.dtype == torch.float32
            and temperatures.shape == logits.shape[:1] and temperatures.is_contiguous()):
        return None
    rows, spans = logits.shape[0], -(-logits.shape[1] // SAMPLE_SPAN)
    # The tokens, then each span's best key (float bits) and column: one allocation, and the
    # scratch's address computed (a view would cost a tensor on every decode step).
    buffer = torch.empty(rows + 2 * rows * spans, dtype=torch.int32, device=logits.device)
    code = _library("sample", logits.device).minisgl_sample(
        buffer.data_ptr(), buffer.data_ptr() + rows * buffer.element_size(), 2 * rows * spans,
        logits.data_ptr(), logits.stride(0), rows, logits.shape[1], temperatures.data_ptr(),
        seed % 2**64, draw % 2**64, _DTYPES[logits.dtype], _stream(logits))
    _check(code, "sample")
    return buffer[:rows]


GEMV_MAX_ROWS = 4  # each row re-reads x from cache per weight piece; more rows suit cuBLAS tiles


def gemv(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> torch.Tensor | None:
    """x @ weight.T in bfloat16 for x [rows, k] with 1 to GEMV_MAX_ROWS rows (weight
    [n_out, k]), summed in float32; gated: weight is SwiGLU's [gate; up] and the result is
    silu(x @ gate.T) * (x @ up.T), [rows, n_out / 2]. None when the kernel does not take these
    tensors."""
    per = 8  # bfloat16 in the kernel's 16-byte pieces
    if not (x.dtype == weight.dtype == torch.bfloat16 and x.dim() == weight.dim() == 2
            and 0 < x.shape[0] <= GEMV_MAX_ROWS and x.shape[1] == weight.shape[1]
            and weight.is_contiguous() and x.stride(1) == 1 and x.shape[1] % per == 0
            and x.stride(0) % per == 0 and x.data_ptr() % 16 == 0
            and weight.data_ptr() % 16 == 0 and not (gated and weight.shape[0] % 2)):
        return None
    n_out = weight.shape[0] // 2 if gated else weight.shape[0]
    y = torch.empty(x.shape[0], n_out, dtype=x.dtype, device=x.device)
    code = _library("gemv", x.device).minisgl_gemv(
        y.data_ptr(), x.data_ptr(), weight.data_ptr(), x.shape[0], n_out, x.shape[1],
        x.stride(0), y.stride(0), int(gated), _stream(x))
    _check(code, "gemv")
    return y


DECODE_ATTENTION_HEAD_DIMS = (32, 64, 128, 256)  # 4 to 32 threads, 8 values each, per token
DECODE_ATTENTION_MAX_GROUP = 4  # query heads per KV head: the merge gives each a warp
DECODE_ATTENTION_MAX_SPLITS = 64  # chunks a request: the merge's lanes hold two each
# Tokens a chunk holds at least: a block pays a fixed start (a chain of dependent loads) and a
# share of the merge, which the keys it reads must outweigh.
DECODE_ATTENTION_MIN_CHUNK = 64
DECODE_ATTENTION_PLAN_HEADER = 4  # int32 before the items: their count, padding to 16 bytes


def _aligned(x: torch.Tensor) -> bool:
    """Every row, and every head vector in it, starts on 16 bytes: the kernel's loads."""
    return x.data_ptr() % 16 == 0 and all(s * x.element_size() % 16 == 0 for s in x.stride()[:-1])


def decode_attention_blocks_per_sm(q_heads: int, kv_heads: int, head_dim: int,
                                   dtype: torch.dtype, device: torch.device) -> int:
    """decode_attention's blocks an SM of `device` runs at once (its registers decide)."""
    if dtype not in _DTYPES:
        raise ValueError(f"decode_attention computes in {tuple(_DTYPES)}, not {dtype}")
    blocks = _library("decode_attention", device).minisgl_decode_attention_blocks_per_sm(
        q_heads, kv_heads, head_dim, _DTYPES[dtype])
    if blocks < 1:
        raise ValueError(f"decode_attention has no build for {q_heads} query heads on "
                         f"{kv_heads} KV heads of {head_dim}")
    return blocks


def decode_attention_items_per_wave(q_heads: int, kv_heads: int, head_dim: int,
                                    dtype: torch.dtype, device: torch.device) -> int:
    """The chunks a plan fits in one wave: the blocks all SMs run at once, per KV head."""
    sm_count = (torch.cuda.get_device_properties(device).multi_processor_count
                if device.type == "cuda" else 1)
    blocks = sm_count * decode_attention_blocks_per_sm(q_heads, kv_heads, head_dim, dtype, device)
    return max(1, blocks // kv_heads)


def decode_attention_max_items(num_reqs: int, items_per_wave: int) -> int:
    """The most chunks (items) a plan of num_reqs requests makes: two waves' worth, at least
    one a request, at most DECODE_ATTENTION_MAX_SPLITS a request."""
    return min(max(num_reqs, 2 * items_per_wave), DECODE_ATTENTION_MAX_SPLITS * num_reqs)


def decode_attention_scratch(num_reqs: int, items_per_wave: int, q_heads: int, kv_heads: int,
                             head_dim: int, device: torch.device
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What decode_attention needs besides its operands, allocated once by its caller, for
    steps of up to num_reqs requests planned for `items_per_wave`: room for every chunk's
    partial result (per query head), one counter per (request, KV head), zero, and the plan."""
    items = decode_attention_max_items(num_reqs, items_per_wave)
    return (torch.empty(items * q_heads * (head_dim + 2), dtype=torch.float32, device=device),
            torch.zeros(num_reqs * kv_heads, dtype=torch.int32, device=device),
            torch.zeros(DECODE_ATTENTION_PLAN_HEADER + 4 * items, dtype=torch.int32, device=device))


def decode_attention_plan(positions: torch.Tensor, items_per_wave: int,
                          scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                          min_chunk: int = DECODE_ATTENTION_MIN_CHUNK) -> bool:
    """Cut each context (positions + 1 tokens) into chunks of at least min_chunk tokens that
    fill a wave of items_per_wave, into the scratch's plan, on the device (a graph replays it).
    False (nothing done) when the kernel does not take these tensors."""
    n, plan = len(positions), scratch[2]
    limit = (1 << 31) // DECODE_ATTENTION_MAX_SPLITS  # the plan counts in int32
    if not (positions.dtype == torch.int64 and positions.dim() == 1 and 0 < n < limit
            and positions.is_contiguous() and 1 <= items_per_wave < limit
            and 1 <= min_chunk < limit
            and plan.dtype == torch.int32 and plan.device == positions.device
            and plan.numel() >= (DECODE_ATTENTION_PLAN_HEADER
                                 + 4 * decode_attention_max_items(n, items_per_wave))):
        return False
    code = _library("decode_attention", positions.device).minisgl_decode_attention_plan(
        plan.data_ptr(), positions.data_ptr(), n, items_per_wave, min_chunk, _stream(positions))
    _check(code, "decode_attention_plan")
    return True


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, page_table: torch.Tensor, rows: torch.Tensor,
                     positions: torch.Tensor, out_loc: torch.Tensor, scale: float,
                     items_per_wave: int,
                     scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                     ) -> torch.Tensor | None:
    """One decode token a request: store k and v at out_loc, then q [reqs, q_heads, head_dim]
    attends to tokens 0..positions (slots in page_table[rows]) as the scratch's plan (trusted)
    cuts them. None (nothing done) when the kernel does not take these tensors."""
    n, q_heads, head_dim = q.shape if q.dim() == 3 else (0, 0, 0)
    partial, finished, plan = scratch
    items = decode_attention_max_items(n, items_per_wave)
    if not (q.dtype in _DTYPES and q.dtype == k.dtype == v.dtype == k_cache.dtype
            == v_cache.dtype and head_dim in DECODE_ATTENTION_HEAD_DIMS and n > 0
            and k.dim() == v.dim() == 3 and k.shape == v.shape and k.stride() == v.stride()
            and k.shape[0] == n and k.shape[2] == head_dim and q_heads % k.shape[1] == 0
            and q_heads // k.shape[1] <= DECODE_ATTENTION_MAX_GROUP
            and all(_aligned(t) for t in (q, k, v, k_cache, v_cache))
            and _rows(q) and _rows(k) and k_cache.shape[1:] == v_cache.shape[1:] == k.shape[1:]
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and page_table.dtype == torch.int32 and page_table.dim() == 2
            and page_table.is_contiguous() and items_per_wave >= 1
            and all(t.dtype == torch.int64 and t.shape == (n,) and t.is_contiguous()
                    and t.device == q.device for t in (rows, positions, out_loc))
            and partial.dtype == torch.float32 and finished.dtype == torch.int32
            and plan.dtype == torch.int32
            and plan.numel() >= DECODE_ATTENTION_PLAN_HEADER + 4 * items
            and items < 1 << 16  # the grid's second dimension
            and partial.numel() >= items * q_heads * (head_dim + 2)
            and finished.numel() >= n * k.shape[1]):
        return None
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    code = _library("decode_attention", q.device).minisgl_decode_attention(
        out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), k.stride(0),
        k_cache.data_ptr(), v_cache.data_ptr(), page_table.data_ptr(), page_table.shape[1],
        rows.data_ptr(), positions.data_ptr(), out_loc.data_ptr(), plan.data_ptr(), items,
        q_heads, k.shape[1], head_dim, scale, partial.data_ptr(), finished.data_ptr(),
        _DTYPES[q.dtype], _stream(q))
    _check(code, "decode_attention")
    return out
