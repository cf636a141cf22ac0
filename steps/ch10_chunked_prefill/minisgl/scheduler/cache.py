from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.kvcache import CacheHandle, create_prefix_cache


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
        prefixes when the free pages run short."""
        spans = [(req, pages_for(req.cached_len, self.page_size),
                  pages_for(req.device_len, self.page_size)) for req in reqs]
        needed = sum(last - first for _, first, last in spans)
        if needed > len(self.free_pages):
            evicted = self.prefix_cache.evict((needed - len(self.free_pages)) * self.page_size)
            self.evicted_pages += len(evicted) // self.page_size
            self._free(evicted)
        for req, first, last in spans:
            row = self.page_table[req.table_idx]
            for index in range(first, last):
                page = self.free_pages.pop()
                row[index * self.page_size : (index + 1) * self.page_size] = torch.arange(
                    page * self.page_size, (page + 1) * self.page_size, dtype=row.dtype)

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
