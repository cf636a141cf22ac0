"""Index arithmetic over ragged batches: one segment per request, in whole-batch tensor ops."""

from __future__ import annotations

import torch


def ragged_arange(starts: torch.Tensor, counts: torch.Tensor,
                  total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.arange(starts[r], starts[r] + counts[r]) for every r, concatenated, and for each
    element the r it belongs to: (owner, values). A handful of ops whatever the number of
    segments — a Python loop of one small tensor per request would cost host time that grows
    with the batch (256 requests in a decode step). Computed on counts' device; there, pass
    `total` (counts' sum, which the host knows): without it the output's size would have to be
    read back from the device, a wait for everything queued before."""
    device = counts.device
    owner = torch.repeat_interleave(torch.arange(len(counts), device=device), counts,
                                    output_size=total)
    first_element = counts.cumsum(0) - counts  # where segment r starts in the output
    return owner, starts[owner] + torch.arange(len(owner), device=device) - first_element[owner]
