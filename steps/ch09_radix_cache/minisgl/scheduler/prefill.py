from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from minisgl.core import Batch, Req, SamplingParams

from .cache import CacheManager, pages_for
from .decode import DecodeManager
from .table import TableManager

# A request sharing at least this many uncached prompt tokens with one admitted into the same
# batch waits a step: once that batch has run, the shared part is in the prefix cache.
DEFER_SHARED_TOKENS = 32


def shared_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    return int((a[:n] == b[:n]).cumprod(0).sum())


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
    and the pages it still needs (all it will ever use minus its cached prefix) fit next to what
    the requests admitted before it are owed. So nothing admitted can run out of KV mid-way."""

    table: TableManager
    cache: CacheManager
    reserved_pages: int
    # The requests admitted so far, by first token: only those can share a prefix with the
    # next. Asking every admitted request would cost the host the square of the batch (256
    # short prompts in one batch: 32,640 pairs).
    admitted: dict[int, list[Req]] = field(default_factory=dict)

    def try_add(self, pending: PendingReq) -> Req | None:
        if self.table.available == 0:
            return None
        handle = self.cache.match(pending.input_ids)
        first = int(pending.input_ids[0])
        if self.cache.prefix_cache.shares_prefixes and any(
                shared_prefix_len(pending.input_ids, r.input_ids) - handle.cached_len
                >= DEFER_SHARED_TOKENS for r in self.admitted.get(first, ())):
            return None
        need = (pages_for(pending.total_tokens, self.cache.page_size)
                - handle.cached_len // self.cache.page_size)
        if self.reserved_pages + need > self.cache.available_pages:
            return None
        self.cache.prefix_cache.lock(handle)  # a locked prefix is no longer evictable: check again
        if self.reserved_pages + need > self.cache.available_pages:
            self.cache.prefix_cache.unlock(handle)
            return None
        self.reserved_pages += need
        req = Req(pending.input_ids, table_idx=self.table.allocate(),
                  cached_len=handle.cached_len, output_len=pending.sampling_params.max_tokens,
                  uid=pending.uid, sampling_params=pending.sampling_params)
        self.cache.attach(req, handle)
        self.admitted.setdefault(first, []).append(req)
        return req


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
        adder = PrefillAdder(self.table, self.cache, self.decode.reserved_pages)
        reqs = []
        while self.pending and (req := adder.try_add(self.pending[0])) is not None:
            self.pending.popleft()
            reqs.append(req)
        return Batch(reqs, "prefill") if reqs else None
