"""The scheduler's trace events, recorded around the methods that take its decisions: the
scheduling itself has no line about tracing."""

from __future__ import annotations

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import InFlight
from minisgl.utils import trace

from .cache import pages_for
from .config import SchedulerConfig
from .scheduler import Scheduler


def create_scheduler(config: SchedulerConfig) -> Scheduler:
    """A TracedScheduler while this process traces, else a Scheduler that pays nothing."""
    return (TracedScheduler if trace.enabled() else Scheduler)(config)


class TracedScheduler(Scheduler):
    """Every method does what the Scheduler's does, and records it: each request queued,
    admitted, aborted and finished, every step, the pages each request gives back."""

    def add_request(self, uid: int, input_ids: list[int] | torch.Tensor,
                    sampling_params: SamplingParams) -> None:
        super().add_request(uid, input_ids, sampling_params)
        trace.instant("queued", uid=uid, prompt_tokens=torch.as_tensor(input_ids).numel(),
                      waiting=len(self.prefill.pending))

    def _compute(self, batch: Batch) -> InFlight:
        """The requests admitted into the batch (before its pages are allocated), then the
        step's span, until the engine's launch returns."""
        size = self.engine.page_size
        step: dict[str, list[int]] = {"uids": [], "tokens": [], "pages": []}
        for req in batch.reqs:
            pages = pages_for(req.device_len, size) - pages_for(req.cached_len, size)
            # A first chunk starts where its matched prefix ends; later chunks start beyond. A
            # running request riding along may start where its own cached prompt ends: skip it.
            if (batch.is_prefill and req not in self.decode.running
                    and self.cache.handles[req].cached_len == req.cached_len):
                trace.instant("admit", uid=req.uid, row=req.table_idx, hit=req.cached_len,
                              prompt_tokens=len(req.input_ids), pages=pages)
            step["uids"].append(req.uid)
            step["tokens"].append(req.extend_len)
            step["pages"].append(pages)
        start = trace.now()  # admission was decided before: it comes first in the trace
        flight = super()._compute(batch)
        trace.span(batch.phase, start, **step)
        return flight

    def abort(self, uid: int) -> bool:
        state = ("waiting" if any(p.uid == uid for p in self.prefill.pending) else
                 "running" if any(r.uid == uid for r in self.decode.running) else None)
        if state is not None:  # before its release, which returns its pages
            trace.instant("abort", uid=uid, state=state)
        return super().abort(uid)

    def _cache_req(self, req: Req, finished: bool) -> None:
        """How many of the request's pages the prefix cache took, how many went back free."""
        before = self.stats()
        super()._cache_req(req, finished)
        after = self.stats()
        trace.instant("pages_returned", uid=req.uid, finished=finished,
                      to_cache=after["cached_pages"] - before["cached_pages"],
                      freed=after["free_pages"] - before["free_pages"])

    def _free(self, req: Req) -> None:
        super()._free(req)
        trace.instant("finish", uid=req.uid, row=req.table_idx)
