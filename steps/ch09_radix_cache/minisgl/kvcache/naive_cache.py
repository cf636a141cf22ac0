from __future__ import annotations

import torch

from .prefix_cache import BasePrefixCache, CacheHandle


class NaivePrefixCache(BasePrefixCache):
    """Caches nothing: every request computes its whole prompt, and finished requests give all
    their pages back at once. The baseline the radix cache is measured against."""

    shares_prefixes = False

    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self._empty = CacheHandle(0, torch.empty(0, dtype=torch.int32))

    def match_prefix(self, token_ids: list[int]) -> CacheHandle:
        return self._empty

    def insert_prefix(self, token_ids: list[int], slots: torch.Tensor) -> tuple[int, CacheHandle]:
        return 0, self._empty

    def lock(self, handle: CacheHandle) -> None:
        pass

    def unlock(self, handle: CacheHandle) -> None:
        pass

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens > 0:
            raise RuntimeError(f"the naive cache holds nothing to evict ({num_tokens} asked)")
        return self._empty.slots

    def check_integrity(self) -> None:
        pass
