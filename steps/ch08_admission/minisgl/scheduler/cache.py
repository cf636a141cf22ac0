from __future__ import annotations

import torch

from minisgl.core import Req


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages that hold `num_tokens` tokens: ceil(num_tokens / page_size)."""
    return -(-num_tokens // page_size)


class CacheManager:
    """Owns the KV pool's free pages and writes the page table.

    A request's token i lives in slot page_table[row, i]; slots come a page at a time, so a new
    page is taken only when a request's tokens cross into it.
    """

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor) -> None:
        self.num_pages, self.page_size, self.page_table = num_pages, page_size, page_table
        self.free_pages = list(range(num_pages))

    @property
    def available_tokens(self) -> int:
        return len(self.free_pages) * self.page_size

    def allocate(self, reqs: list[Req]) -> None:
        """Give every request slots for its tokens [cached_len, device_len)."""
        for req in reqs:
            first_page = pages_for(req.cached_len, self.page_size)  # pages already held
            last_page = pages_for(req.device_len, self.page_size)
            if last_page - first_page > len(self.free_pages):
                raise RuntimeError(f"out of KV pages: need {last_page - first_page}, "
                                   f"{len(self.free_pages)} free")
            row = self.page_table[req.table_idx]
            for page_index in range(first_page, last_page):
                page = self.free_pages.pop()
                start = page_index * self.page_size
                row[start : start + self.page_size] = torch.arange(
                    page * self.page_size, (page + 1) * self.page_size, dtype=row.dtype)

    def free(self, req: Req) -> None:
        """Return every page the finished request holds."""
        num_pages = pages_for(req.cached_len, self.page_size)
        slots = self.page_table[req.table_idx, : num_pages * self.page_size : self.page_size]
        self.free_pages.extend((slots // self.page_size).tolist())
