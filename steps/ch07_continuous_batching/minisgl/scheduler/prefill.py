from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from minisgl.core import Batch, Req, SamplingParams

from .table import TableManager


@dataclass
class PendingReq:
    """A request that has arrived but holds no resources yet."""

    uid: int
    input_ids: torch.Tensor  # int32, CPU
    sampling_params: SamplingParams


class PrefillManager:
    """The queue of arrived requests, admitted in arrival order into prefill batches."""

    def __init__(self, table: TableManager) -> None:
        self.table = table
        self.pending: deque[PendingReq] = deque()

    def add(self, req: PendingReq) -> None:
        self.pending.append(req)

    @property
    def runnable(self) -> bool:
        return bool(self.pending)

    def schedule_next_batch(self) -> Batch | None:
        """Admit waiting requests while a page-table row is free."""
        reqs = []
        while self.pending and self.table.available > 0:
            pending = self.pending.popleft()
            reqs.append(Req(pending.input_ids, table_idx=self.table.allocate(), cached_len=0,
                            output_len=pending.sampling_params.max_tokens, uid=pending.uid,
                            sampling_params=pending.sampling_params))
        return Batch(reqs, "prefill") if reqs else None
