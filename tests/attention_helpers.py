"""The attention tests' setup: random requests' Q/K/V stored in a paged pool with shuffled
pages, the torch backend over it, and dense causal attention per request as the reference.
Chapter 5's tests use it, and chapter 10's for the mixed batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minisgl.attention import TorchAttentionBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVPool

NUM_LAYERS, LAYER, KV_HEADS, HEAD_DIM, TABLE_ROWS, MAX_LEN = 2, 1, 2, 16, 8, 48


@dataclass
class Seq:
    """One request's full Q/K/V and where its tokens live in the pool."""

    row: int  # page-table row
    q: torch.Tensor  # [length, q_heads, head_dim]
    k: torch.Tensor  # [length, kv_heads, head_dim]
    v: torch.Tensor

    @property
    def length(self) -> int:
        return len(self.k)


class Setup:
    def __init__(self, seed: int, page_size: int, q_per_kv: int, min_len: int = 1) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.page_size = page_size
        num_reqs = self.randint(1, 5)
        lengths = [self.randint(min_len, MAX_LEN) for _ in range(num_reqs)]
        rows = torch.randperm(TABLE_ROWS, generator=self.gen)[:num_reqs].tolist()
        num_pages = sum(-(-n // page_size) for n in lengths) + 3
        self.pool = MHAKVPool(NUM_LAYERS, num_pages, page_size, KV_HEADS, HEAD_DIM, torch.float32,
                              "cpu")
        self.page_table = torch.zeros(TABLE_ROWS, MAX_LEN, dtype=torch.int32)
        self.backend = TorchAttentionBackend(self.pool, self.page_table)
        free_pages = torch.randperm(num_pages, generator=self.gen).tolist()
        self.seqs = []
        for row, n in zip(rows, lengths):
            for pos in range(n):  # a fresh page from the shuffled free list at every page start
                if pos % page_size == 0:
                    page = free_pages.pop()
                self.page_table[row, pos] = page * page_size + pos % page_size
            self.seqs.append(Seq(row, self.randn(n, KV_HEADS * q_per_kv), self.randn(n, KV_HEADS),
                                 self.randn(n, KV_HEADS)))

    def randint(self, low: int, high: int) -> int:
        """Uniform in [low, high]."""
        return int(torch.randint(low, high + 1, (1,), generator=self.gen))

    def randn(self, n: int, heads: int) -> torch.Tensor:
        return torch.randn(n, heads, HEAD_DIM, generator=self.gen)

    def forward(self, spans: list[tuple[Seq, int, int]], phase: str = "prefill"):
        """Forward the tokens [cached_len, end) of each (seq, cached_len, end) as one batch."""
        reqs = [Req(torch.zeros(end, dtype=torch.int32), table_idx=s.row, cached_len=cached,
                    output_len=1, uid=i, sampling_params=SamplingParams())
                for i, (s, cached, end) in enumerate(spans)]
        batch = Batch(reqs, phase)  # type: ignore[arg-type]
        batch.out_loc = torch.cat([self.page_table[s.row, c:e] for s, c, e in spans]).long()
        self.backend.prepare_metadata(batch)
        q, k, v = (torch.cat([getattr(s, name)[c:e] for s, c, e in spans]) for name in "qkv")
        return self.backend.forward(q, k, v, LAYER, batch), batch


def dense_causal_reference(spans: list[tuple[Seq, int, int]]) -> torch.Tensor:
    """Per request, in float64: queries [cached, end) over keys [0, end), query at position p
    seeing keys 0..p; KV head h serves query heads h*group .. (h+1)*group - 1."""
    outs = []
    for s, cached, end in spans:
        group = s.q.shape[1] // s.k.shape[1]
        q = s.q[cached:end].double().transpose(0, 1)  # [heads, queries, dim]
        k = s.k[:end].double().repeat_interleave(group, dim=1).transpose(0, 1)
        v = s.v[:end].double().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q @ k.transpose(1, 2) / math.sqrt(HEAD_DIM)
        query_pos = torch.arange(cached, end)[:, None]
        scores = scores.masked_fill(torch.arange(end)[None, :] > query_pos, float("-inf"))
        outs.append((scores.softmax(-1) @ v).transpose(0, 1))
    return torch.cat(outs).float()
