from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams


@dataclass(eq=False)
class Req:
    """One request as the engine sees it.

    Its tokens live in three stretches: [0, cached_len) already have K/V in the cache,
    [cached_len, device_len) are what the next forward computes, and the request may grow to
    max_device_len = prompt + max_tokens. Lengths that can be derived are properties, not fields.
    """

    input_ids: torch.Tensor  # int32 on the CPU: the prompt, then every token sampled so far
    table_idx: int  # this request's row of the page table (its "slot")
    cached_len: int
    output_len: int  # how many tokens it may still generate when it is created
    uid: int
    sampling_params: SamplingParams

    def __post_init__(self) -> None:
        if self.input_ids.device.type != "cpu":
            raise ValueError("Req.input_ids must be a CPU tensor")
        self.device_len = len(self.input_ids)
        self.max_device_len = self.device_len + self.output_len
        if not 0 <= self.cached_len < self.device_len:
            raise ValueError(f"cached_len {self.cached_len} must be in [0, {self.device_len})")
        # Room for every token the request may generate: appending one is a write into it, not
        # a copy of all before it, and input_ids is a view of its first tokens. The scheduler
        # appends once per request per step, so at a batch of 256 this is on every step's path.
        self._tokens = torch.empty(self.max_device_len, dtype=torch.int32)
        self._tokens[: self.device_len] = self.input_ids
        self._writable = self._tokens.numpy()  # the same memory: numpy writes one int in ~0.1 µs
        self.input_ids = self._tokens[: self.device_len]

    @property
    def extend_len(self) -> int:
        """Tokens the next forward computes for this request."""
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        """Tokens this request may still generate."""
        return self.max_device_len - self.device_len

    @property
    def can_decode(self) -> bool:
        return self.remain_len > 0

    def complete_one(self) -> None:
        """After a forward: everything computed is now cached, and one new token is due."""
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, next_token: int) -> None:
        n = len(self.input_ids)
        if n == self.max_device_len:
            raise ValueError(f"request {self.uid} already holds its {self.max_device_len} tokens")
        self._writable[n] = next_token
        self.input_ids = self._tokens[: n + 1]

    @property
    def output_ids(self) -> list[int]:
        return self.input_ids[self.max_device_len - self.output_len :].tolist()

    def __repr__(self) -> str:
        return (f"Req(uid={self.uid}, table_idx={self.table_idx}, cached_len={self.cached_len}, "
                f"device_len={self.device_len}, max_device_len={self.max_device_len})")
