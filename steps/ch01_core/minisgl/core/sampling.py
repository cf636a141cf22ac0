from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its next tokens. Out-of-range values fail at construction, so a bad
    request is rejected before it reaches a batch."""

    temperature: float = 0.0  # 0 means greedy
    top_k: int = -1  # -1 means the whole vocabulary
    top_p: float = 1.0
    max_tokens: int = 1024
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def is_greedy(self) -> bool:
        return (self.temperature == 0.0 or self.top_k == 1) and self.top_p == 1.0
