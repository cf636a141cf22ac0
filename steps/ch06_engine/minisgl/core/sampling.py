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


def fit_max_tokens(prompt_len: int, max_tokens: int | None, max_seq_len: int) -> int:
    """The request-length rule, and its one owner: a prompt of at least one token, plus every
    token the request may generate, fits in max_seq_len. max_tokens=None asks for as many as
    fit. Returns the max_tokens the request runs with, or raises ValueError naming the value
    and the limit. The scheduler asks it for each request it queues and the offline LLM before
    queueing any; nothing else checks a request's length."""
    if prompt_len < 1:
        raise ValueError("the prompt is empty")
    room = max_seq_len - prompt_len
    if max_tokens is None:  # as many as fit
        if room < 1:
            raise ValueError(f"prompt has {prompt_len:,} tokens; max_seq_len is {max_seq_len:,}")
        return room
    if max_tokens > room:
        raise ValueError(f"prompt has {prompt_len:,} tokens and asks for up to {max_tokens:,} "
                         f"more; max_seq_len is {max_seq_len:,}")
    return max_tokens
