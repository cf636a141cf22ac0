from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from minisgl.core import Batch, Req, SamplingParams

from .cache import CacheManager, pages_for
from .decode import DecodeManager
from .table import TableManager


@dataclass
class PendingReq:
    """A request that has arrived but holds no resources yet."""

    uid: int
    input_ids: torch.Tensor  # int32, CPU
    sampling_params: SamplingParams

    @property
    def total_tokens(self) -> int:
        """Tokens that get K/V over its whole life: the prompt and all but the last output."""
        return len(self.input_ids) + self.sampling_params.max_tokens - 1


@dataclass
class PrefillAdder:
    """Admission for one prefill batch. A request is admitted only if a page-table row is free
    and the free pages cover, besides what running requests are still owed, everything the
    request will need until it finishes. So nothing admitted can run out of KV mid-way."""

    table: TableManager
    free_pages: int
    reserved_pages: int
    page_size: int

    def try_add(self, pending: PendingReq) -> Req | None:
        need = pages_for(pending.total_tokens, self.page_size)
        if self.table.available == 0 or self.reserved_pages + need > self.free_pages:
            return None
        self.reserved_pages += need
        return Req(pending.input_ids, table_idx=self.table.allocate(), cached_len=0,
                   output_len=pending.sampling_params.max_tokens, uid=pending.uid,
                   sampling_params=pending.sampling_params)


class PrefillManager:
    """The queue of arrived requests, admitted in arrival order into prefill batches."""

    def __init__(self, table: TableManager, cache: CacheManager, decode: DecodeManager) -> None:
        self.table, self.cache, self.decode = table, cache, decode
        self.pending: deque[PendingReq] = deque()

    def add(self, req: PendingReq) -> None:
        self.pending.append(req)

    @property
    def runnable(self) -> bool:
        return bool(self.pending)

    def schedule_next_batch(self) -> Batch | None:
        """Admit waiting requests in order until the first that does not fit; it and everyone
        behind it wait for a later step (first come, first served)."""
        adder = PrefillAdder(self.table, len(self.cache.free_pages), self.decode.reserved_pages,
                             self.cache.page_size)
        reqs = []
        while self.pending and (req := adder.try_add(self.pending[0])) is not None:
            self.pending.popleft()
            reqs.append(req)
        return Batch(reqs, "prefill") if reqs else None
