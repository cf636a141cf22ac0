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


class ChunkedReq(Req):
    """A prompt prefix computed in this step while the rest of the prompt waits for later
    steps. Its input_ids stop where the chunk stops; it samples nothing and never decodes."""

    @property
    def can_decode(self) -> bool:
        return False


@dataclass
class PendingReq:
    """A request that has arrived but not finished its prefill. `chunk` is the part of its
    prompt computed so far, once it has been admitted."""

    uid: int
    input_ids: torch.Tensor  # int32, CPU
    sampling_params: SamplingParams
    chunk: ChunkedReq | None = None

    @property
    def total_tokens(self) -> int:
        """Tokens that get K/V over its whole life: the prompt and all but the last output."""
        return len(self.input_ids) + self.sampling_params.max_tokens - 1


@dataclass
class PrefillAdder:
    """Admission for one prefill batch of at most `token_budget` prompt tokens. A request is
    admitted only if a page-table row is free and the pages it still needs (all it will ever
    use minus its cached prefix) fit next to what the requests before it are owed. So nothing
    admitted can run out of KV mid-way. A prompt longer than the budget left is cut: the first
    chunk runs now, the rest in later batches."""

    table: TableManager
    cache: CacheManager
    reserved_pages: int
    token_budget: int
    # The requests admitted so far, by first token: only those can share a prefix with the
    # next. Asking every admitted request would cost the host the square of the batch (256
    # short prompts in one batch: 32,640 pairs).
    admitted: dict[int, list[Req]] = field(default_factory=dict)

    def try_add(self, pending: PendingReq) -> Req | None:
        if self.token_budget == 0:
            return None
        if pending.chunk is not None:  # admitted before: it only needs its next chunk
            prev = pending.chunk
            self.reserved_pages += (pages_for(pending.total_tokens, self.cache.page_size)
                                    - pages_for(prev.cached_len, self.cache.page_size))
            return self._next_chunk(pending, prev.table_idx, prev.cached_len, prev)
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
        req = self._next_chunk(pending, self.table.allocate(), handle.cached_len, None)
        self.cache.attach(req, handle)
        self.admitted.setdefault(first, []).append(req)
        return req

    def _next_chunk(self, pending: PendingReq, row: int, cached_len: int,
                    prev: ChunkedReq | None) -> Req:
        size = min(self.token_budget, len(pending.input_ids) - cached_len)
        self.token_budget -= size
        end = cached_len + size
        # The engine reads input ids from the device's token pool: put the chunk there.
        self.table.token_pool[row, cached_len:end] = pending.input_ids[cached_len:end]
        kind = Req if end == len(pending.input_ids) else ChunkedReq
        req = kind(pending.input_ids[:end], table_idx=row, cached_len=cached_len,
                   output_len=pending.sampling_params.max_tokens, uid=pending.uid,
                   sampling_params=pending.sampling_params)
        if prev is not None:
            self.cache.transfer(prev, req)
        return req


class PrefillManager:
    """The queue of arrived requests, admitted in arrival order into prefill batches."""

    def __init__(self, table: TableManager, cache: CacheManager, decode: DecodeManager,
                 max_prefill_length: int) -> None:
        self.table, self.cache, self.decode = table, cache, decode
        self.max_prefill_length = max_prefill_length
        self.pending: deque[PendingReq] = deque()

    def add(self, req: PendingReq) -> None:
        self.pending.append(req)

    @property
    def runnable(self) -> bool:
        return bool(self.pending)

    def schedule_next_batch(self) -> Batch | None:
        """Admit waiting requests in order until the first that does not fit or the token
        budget is spent; a cut prompt stays at the head of the queue for its next chunk."""
        adder = PrefillAdder(self.table, self.cache, self.decode.reserved_pages,
                             self.max_prefill_length)
        reqs = []
        while self.pending and (req := adder.try_add(self.pending[0])) is not None:
            reqs.append(req)
            if isinstance(req, ChunkedReq):
                self.pending[0].chunk = req
                break  # the budget is spent
            self.pending.popleft()
        return Batch(reqs, "prefill") if reqs else None
