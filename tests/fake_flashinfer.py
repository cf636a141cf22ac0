"""A stand-in for the `flashinfer` package on the CPU: the two wrapper classes our backends use,
with FlashInfer's signatures, computing attention with plain torch — and checking, call by call,
the semantics our backends rely on (as FlashInfer's documentation states them):

- plan() before run(); `calls` lets a test check one plan per batch, then one run per layer;
- indptr / indices / last_page_len: int32; indptr starts at 0 and never decreases;
  len(indices) == indptr[-1]; 1 <= last_page_len <= page_size; seq_lens, when given, equal
  (pages - 1) * page_size + last_page_len; indptr, last_page_len, seq_lens and qo_indptr are
  host tensors (plan reads them on the host), the page indices a device tensor;
- run(): q is [qo_indptr[-1] (decode: batch size), num_qo_heads, head_dim] in the planned dtype,
  the cache is (K, V) pages in the NHD layout [num_pages, page_size, num_kv_heads, head_dim];
- prefill is causal with the mask aligned to the end of each request's keys; sm_scale, when
  given, scales the scores (so a wrong scale gives wrong tokens).

Install it with `monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)`; `calls`
records ("plan" | "run", wrapper kind) for the tests to read.
"""

from __future__ import annotations

import torch

calls: list[tuple[str, str]] = []


def _check_indptr(name: str, indptr: torch.Tensor) -> None:
    assert indptr.dtype == torch.int32 and indptr.dim() == 1, f"{name}: 1-D int32"
    assert indptr.device.type == "cpu", f"{name} must be a host tensor"
    assert int(indptr[0]) == 0 and bool((indptr[1:] >= indptr[:-1]).all()), \
        f"{name} must start at 0 and never decrease: {indptr.tolist()}"


class _Wrapper:
    kind = ""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 backend: str = "auto", **kwargs: object) -> None:
        assert float_workspace_buffer.dtype == torch.uint8, "the workspace is a byte buffer"
        assert kv_layout == "NHD", "our pool is [pages, page_size, heads, head_dim]: NHD"
        assert backend in ("auto", "fa2", "fa3"), backend
        self.backend, self.planned = backend, False
        self.workspace_device = float_workspace_buffer.device

    def _plan(self, qo_indptr: torch.Tensor | None, indptr: torch.Tensor, indices: torch.Tensor,
              last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim: int,
              page_size: int, q_data_type: torch.dtype, kv_data_type: torch.dtype | None,
              sm_scale: float | None, seq_lens: torch.Tensor | None) -> None:
        _check_indptr("kv indptr", indptr)
        assert len(last_page_len) == len(indptr) - 1, "one last_page_len per request"
        assert last_page_len.dtype == torch.int32 and last_page_len.device.type == "cpu"
        assert bool(((last_page_len >= 1) & (last_page_len <= page_size)).all()), \
            f"last_page_len outside [1, {page_size}]: {last_page_len.tolist()}"
        assert indices.dtype == torch.int32, "page indices are int32"
        assert indices.device == self.workspace_device, "page indices live on the device"
        assert len(indices) == int(indptr[-1]), "len(indices) must equal indptr[-1]"
        pages = indptr[1:] - indptr[:-1]
        lengths = (pages - 1) * page_size + last_page_len
        if seq_lens is not None:
            assert seq_lens.device.type == "cpu", "seq_lens is a host tensor"
            assert torch.equal(seq_lens.to(lengths.dtype), lengths), \
                f"seq_lens {seq_lens.tolist()} != pages and last_page_len {lengths.tolist()}"
        if qo_indptr is not None:
            _check_indptr("qo indptr", qo_indptr)
            assert len(qo_indptr) == len(indptr), "qo_indptr and kv indptr: one entry each"
            assert bool((qo_indptr[1:] - qo_indptr[:-1] <= lengths).all()), \
                "a request has more queries than keys"
        assert num_qo_heads % num_kv_heads == 0, "GQA: query heads in groups per KV head"
        self.qo_indptr = qo_indptr.clone() if qo_indptr is not None else None
        self.indptr, self.indices = indptr.clone(), indices.clone()
        self.lengths, self.page_size = lengths, page_size
        self.heads, self.head_dim = (num_qo_heads, num_kv_heads), head_dim
        self.dtype, self.kv_dtype = q_data_type, kv_data_type or q_data_type
        self.sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
        self.planned = True
        calls.append(("plan", self.kind))

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
            **kwargs: object) -> torch.Tensor:
        assert self.planned, "run() before plan()"
        k_pages, v_pages = paged_kv_cache
        num_qo_heads, num_kv_heads = self.heads
        assert k_pages.shape == v_pages.shape and k_pages.dim() == 4
        assert k_pages.shape[1:] == (self.page_size, num_kv_heads, self.head_dim), \
            f"cache {tuple(k_pages.shape)} is not NHD pages of the planned shape"
        rows = len(self.lengths) if self.qo_indptr is None else int(self.qo_indptr[-1])
        assert q.shape == (rows, num_qo_heads, self.head_dim), \
            f"q {tuple(q.shape)} != planned ({rows}, {num_qo_heads}, {self.head_dim})"
        assert q.dtype == self.dtype and k_pages.dtype == self.kv_dtype
        calls.append(("run", self.kind))
        out = torch.empty_like(q)
        group = num_qo_heads // num_kv_heads
        for b, length in enumerate(self.lengths.tolist()):
            pages = self.indices[int(self.indptr[b]): int(self.indptr[b + 1])].long()
            keys = k_pages[pages].flatten(0, 1)[:length]  # [length, kv_heads, head_dim]
            values = v_pages[pages].flatten(0, 1)[:length]
            first, last = ((b, b + 1) if self.qo_indptr is None
                           else (int(self.qo_indptr[b]), int(self.qo_indptr[b + 1])))
            queries = q[first:last].float()  # [m, q_heads, head_dim]
            keys = keys.float().repeat_interleave(group, dim=1)
            values = values.float().repeat_interleave(group, dim=1)
            scores = torch.einsum("mhd,nhd->hmn", queries, keys) * self.sm_scale
            m = last - first
            # Causal, aligned to the end: query i (of m) is token length - m + i.
            visible = torch.arange(length)[None, :] <= (length - m + torch.arange(m))[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
            out[first:last] = torch.einsum("hmn,nhd->mhd", scores.softmax(-1),
                                           values).to(q.dtype)
        return out


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    kind = "decode"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 **kwargs: object) -> None:
        super().__init__(float_workspace_buffer, kv_layout, **kwargs)  # type: ignore[arg-type]
        self.use_tensor_cores = use_tensor_cores

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             pos_encoding_mode: str = "NONE", q_data_type: torch.dtype = torch.float16,
             kv_data_type: torch.dtype | None = None, sm_scale: float | None = None,
             non_blocking: bool = True, seq_lens: torch.Tensor | None = None,
             **kwargs: object) -> None:
        assert pos_encoding_mode == "NONE", "RoPE is applied before attention, not inside it"
        self._plan(None, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                   page_size, q_data_type, kv_data_type, sm_scale, seq_lens)


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    kind = "prefill"

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
             paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             sm_scale: float | None = None, q_data_type: torch.dtype = torch.float16,
             kv_data_type: torch.dtype | None = None, non_blocking: bool = True,
             seq_lens: torch.Tensor | None = None, **kwargs: object) -> None:
        assert causal, "a prompt's token may not see the tokens after it: causal=True"
        assert pos_encoding_mode == "NONE", "RoPE is applied before attention, not inside it"
        self._plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                   num_qo_heads, num_kv_heads, head_dim_qk, page_size, q_data_type,
                   kv_data_type, sm_scale, seq_lens)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Graph mode: the batch size is fixed, plan() copies the shape into the caller's static
    buffers, and run() reads it back from them — as captured kernels do at every replay, so a
    buffer the caller forgot to refill gives the stale batch's answer here too."""

    def __init__(self, workspace_buffer: torch.Tensor, indptr_buffer: torch.Tensor,
                 indices_buffer: torch.Tensor, last_page_len_buffer: torch.Tensor,
                 kv_layout: str = "NHD", use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores)
        self.buffers = (indptr_buffer, indices_buffer, last_page_len_buffer)
        assert len(indptr_buffer) == len(last_page_len_buffer) + 1

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             *args: object, **kwargs: object) -> None:
        indptr_buffer, indices_buffer, last_page_len_buffer = self.buffers
        assert len(last_page_len) == len(last_page_len_buffer), "graph mode: fixed batch size"
        assert len(indices) <= len(indices_buffer), "more pages than the indices buffer holds"
        super().plan(indptr, indices, last_page_len, *args, **kwargs)  # type: ignore[arg-type]
        indptr_buffer.copy_(indptr)
        indices_buffer[: len(indices)].copy_(indices)
        last_page_len_buffer.copy_(last_page_len)

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
            **kwargs: object) -> torch.Tensor:
        indptr_buffer, indices_buffer, last_page_len_buffer = self.buffers
        self.indptr = indptr_buffer.cpu()
        self.indices = indices_buffer[: int(self.indptr[-1])]
        pages = self.indptr[1:] - self.indptr[:-1]
        self.lengths = (pages - 1) * self.page_size + last_page_len_buffer.cpu()
        return super().run(q, paged_kv_cache, **kwargs)
