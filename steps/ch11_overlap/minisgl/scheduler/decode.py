from __future__ import annotations

from minisgl.core import Batch, Req

from .cache import pages_for


def pages_to_finish(req: Req, page_size: int) -> int:
    """KV pages `req` will still take before it finishes. Its tokens [0, cached_len) hold pages
    already; at most max_device_len - 1 tokens ever get K/V (the last sampled one never runs)."""
    return (pages_for(req.max_device_len - 1, page_size)
            - pages_for(req.cached_len, page_size))


class DecodeManager:
    """The running requests, in a stable order: each advances by one token in each decode
    batch. With overlap a request joins once its prefill is launched, and one that met EOS
    leaves only when that token reaches the host."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.running: dict[Req, None] = {}

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    @property
    def reserved_pages(self) -> int:
        """Pages the running requests are still owed: admission must leave them free."""
        return sum(pages_to_finish(req, self.page_size) for req in self.running)

    def add(self, req: Req) -> None:
        self.running[req] = None

    def remove(self, req: Req) -> None:
        self.running.pop(req, None)

    def schedule_next_batch(self) -> Batch | None:
        return Batch(list(self.running), "decode") if self.running else None
