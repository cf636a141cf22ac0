from __future__ import annotations

import torch


class TableManager:
    """Rows of the page table, and a token pool of the same shape on the device. A request holds
    one row from admission until it finishes; token_pool[row, i] is its token i, the prompt's
    copied in at admission and each sampled one written on the device, so the next step's input
    ids never wait for the host."""

    def __init__(self, page_table: torch.Tensor, token_pool: torch.Tensor | None = None) -> None:
        self.free_rows = list(range(page_table.shape[0]))
        # From chapter 18 the engine owns the token pool (its graphs read it) and lends it here.
        self.token_pool = torch.zeros_like(page_table) if token_pool is None else token_pool

    @property
    def available(self) -> int:
        return len(self.free_rows)

    def allocate(self) -> int:
        return self.free_rows.pop()

    def free(self, row: int) -> None:
        self.free_rows.append(row)
