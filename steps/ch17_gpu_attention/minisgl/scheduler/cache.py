from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.kvcache import CacheHandle, create_prefix_cache
from minisgl.utils import pin
from minisgl.utils.ragged import ragged_arange


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages that hold `num_tokens` tokens: ceil(num_tokens / page_size)."""
    return -(-num_tokens // page_size)


class CacheManager:
    """Owns the KV pool's pages: free ones, ones in the prefix cache, ones a request holds. A
    running request's page-table row starts with the prefix it matched (locked by its handle)
    and continues with pages it allocated; its computed tokens go into the prefix cache."""

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor,
                 cache_type: str) -> None:
        self.num_pages, self.page_size, self.page_table = num_pages, page_size, page_table
        self.free_pages = list(range(num_pages))
        self.prefix_cache = create_prefix_cache(cache_type, page_size)
        self.handles: dict[Req, CacheHandle] = {}
        self.hit_tokens = self.evicted_pages = 0  # statistics

    @property
    def available_pages(self) -> int:
        """Free pages plus those eviction could free now."""
        return len(self.free_pages) + self.prefix_cache.evictable_size // self.page_size

    def match(self, token_ids: torch.Tensor) -> CacheHandle:
        # The last prompt token is always computed: its logits give the first output token.
        return self.prefix_cache.match_prefix(token_ids[:-1].tolist())

    def attach(self, req: Req, handle: CacheHandle) -> None:
        """`req` starts from the matched prefix, which `handle` (already locked) keeps alive."""
        self.handles[req] = handle
        self.hit_tokens += handle.cached_len
        self.page_table[req.table_idx, : handle.cached_len] = handle.slots

    def transfer(self, old: Req, new: Req) -> None:
        """The next chunk of a prompt continues `old` as `new`: it inherits the locked prefix."""
        self.handles[new] = self.handles.pop(old)

    def allocate(self, reqs: list[Req]) -> None:
        """Give every request slots for its tokens [cached_len, device_len), evicting cached
        prefixes when the free pages run short.

        One scatter into the page table for the whole batch: a decode step of 256 requests at
        page_size 1 needs 256 pages, and a Python loop of small device writes per page would
        cost more host time than the step's compute.
        """
        size = self.page_size
        first = torch.tensor([pages_for(r.cached_len, size) for r in reqs], dtype=torch.long)
        count = torch.tensor([pages_for(r.device_len, size) for r in reqs]) - first
        needed = int(count.sum())
        if needed > len(self.free_pages):
            evicted = self.prefix_cache.evict((needed - len(self.free_pages)) * size)
            self.evicted_pages += len(evicted) // size
            self._free(evicted)
        if needed == 0:
            return
        pages = torch.tensor(self.free_pages[-needed:][::-1])  # the order pop() would take
        del self.free_pages[-needed:]
        # Page i of the batch's new pages is page `index` of request `owner`.
        owner, index = ragged_arange(first, count)
        offsets = torch.arange(size)
        rows = torch.tensor([r.table_idx for r in reqs])[owner]
        columns = (index[:, None] * size + offsets).flatten()
        slots = (pages[:, None] * size + offsets).flatten()
        # One pinned, asynchronous copy to the device (a pageable one would wait for it).
        device = self.page_table.device
        where = pin(torch.stack([rows.repeat_interleave(size), columns, slots]), device)
        where = where.to(device, non_blocking=True)
        self.page_table[where[0], where[1]] = where[2].to(self.page_table.dtype)

    def cache_req(self, req: Req, finished: bool) -> None:
        """Insert req's computed tokens [0, cached_len) into the prefix cache.

        Pages another request cached meanwhile are duplicates: the row switches to the cached
        copy and ours go back. A finished request also returns its tail, the part shorter than
        a page that the cache cannot take; a running one keeps it and locks its new prefix.
        """
        row = self.page_table[req.table_idx]
        old = self.handles.pop(req)
        already, new = self.prefix_cache.insert_prefix(req.input_ids[: req.cached_len].tolist(),
                                                       row[: req.cached_len])
        if already > old.cached_len:
            own = row[old.cached_len : already].clone()
            row[old.cached_len : already] = new.slots[old.cached_len : already]
            self._free(own[own != row[old.cached_len : already]])
        self.prefix_cache.unlock(old)
        if finished:
            self._free(row[new.cached_len : pages_for(req.cached_len, self.page_size)
                           * self.page_size])
        else:
            self.prefix_cache.lock(new)
            self.handles[req] = new

    def _free(self, slots: torch.Tensor) -> None:
        """Return the pages of `slots` (whole pages, in order)."""
        self.free_pages.extend((slots[:: self.page_size] // self.page_size).tolist())

    def held_pages(self, running: list[Req]) -> int:
        """Pages running requests hold outside the prefix cache (their unshared tails)."""
        return sum(pages_for(r.cached_len, self.page_size)
                   - self.handles[r].cached_len // self.page_size for r in running)

    def check_integrity(self, running: list[Req]) -> None:
        """Every page is in exactly one place: free, in the prefix cache, or held by a request."""
        self.prefix_cache.check_integrity()
        cached = (self.prefix_cache.evictable_size + self.prefix_cache.protected_size)
        total = len(self.free_pages) + cached // self.page_size + self.held_pages(running)
        if total != self.num_pages or len(set(self.free_pages)) != len(self.free_pages):
            raise AssertionError(f"{len(self.free_pages)} free + {cached // self.page_size} cached"
                                 f" + {self.held_pages(running)} held != {self.num_pages} pages")
