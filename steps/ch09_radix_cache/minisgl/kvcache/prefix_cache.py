from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheHandle:
    """A matched or inserted prefix: its length and where its K/V lives. `node` is the cache's
    own bookkeeping (the radix node the prefix ends at); users only pass the handle back."""

    cached_len: int
    slots: torch.Tensor  # [cached_len] KV-pool slots of the prefix, in token order
    node: object = None


class BasePrefixCache(ABC):
    """KV of finished prefixes, kept so that a later request starting with the same tokens skips
    computing them; only whole pages are shared. A running request locks the prefix it uses
    against eviction. Sizes are in tokens: `evictable_size` unlocked, `protected_size` locked."""

    shares_prefixes = True  # False for a cache that never hits: scheduling need not wait for it

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.evictable_size = self.protected_size = 0

    @abstractmethod
    def match_prefix(self, token_ids: list[int]) -> CacheHandle:
        """The longest cached, page-aligned prefix of token_ids."""

    @abstractmethod
    def insert_prefix(self, token_ids: list[int], slots: torch.Tensor) -> tuple[int, CacheHandle]:
        """Cache the page-aligned part of token_ids with its slots. Returns how much of it was
        cached already (those slots of the caller are duplicates it must free) and the handle of
        the whole inserted prefix."""

    @abstractmethod
    def lock(self, handle: CacheHandle) -> None: ...

    @abstractmethod
    def unlock(self, handle: CacheHandle) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Free at least num_tokens tokens of unlocked prefixes, least recently used first, and
        return their slots."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise if the cache's bookkeeping is inconsistent (tests call it after every step)."""
