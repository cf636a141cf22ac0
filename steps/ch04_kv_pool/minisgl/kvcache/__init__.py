"""The KV cache: a paged pool of per-layer K/V buffers (later also the prefix caches)."""

from .mha_pool import MHAKVPool
