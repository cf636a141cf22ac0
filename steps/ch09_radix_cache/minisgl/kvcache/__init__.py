"""The KV cache: the paged pool of per-layer K/V buffers, and the prefix caches that let
requests share the K/V of a common prefix."""

from minisgl.utils import Registry

from .mha_pool import MHAKVPool
from .naive_cache import NaivePrefixCache
from .prefix_cache import BasePrefixCache, CacheHandle
from .radix_cache import RadixCache

PREFIX_CACHES: Registry[type[BasePrefixCache]] = Registry("prefix cache")
PREFIX_CACHES.register("radix")(RadixCache)
PREFIX_CACHES.register("naive")(NaivePrefixCache)


def create_prefix_cache(name: str, page_size: int) -> BasePrefixCache:
    return PREFIX_CACHES.get(name)(page_size)
