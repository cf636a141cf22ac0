from __future__ import annotations

from minisgl.core import Batch, Req


class DecodeManager:
    """The running requests: every one of them advances by one token in each decode batch."""

    def __init__(self) -> None:
        self.running: list[Req] = []

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    def add(self, req: Req) -> None:
        self.running.append(req)

    def remove(self, req: Req) -> None:
        self.running.remove(req)

    def schedule_next_batch(self) -> Batch | None:
        return Batch(list(self.running), "decode") if self.running else None
