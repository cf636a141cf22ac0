from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TPInfo:
    """This process's place among the tensor-parallel ranks."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"TP rank {self.rank} is not in [0, {self.size})")

    def shard(self, total: int, what: str, why: str) -> int:
        """This rank's share of `total` things; they must divide evenly, else a ValueError says
        what did not divide and why it has to."""
        if total % self.size:
            raise ValueError(f"{what} ({total}) is not divisible by the TP size {self.size}: "
                             f"{why}")
        return total // self.size


_tp_info = TPInfo()


def set_tp_info(info: TPInfo) -> None:
    global _tp_info
    _tp_info = info


def get_tp_info() -> TPInfo:
    """Layers read it while they are built, to size their shards."""
    return _tp_info
