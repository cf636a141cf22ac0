from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from minisgl.core import Batch, Req, SamplingParams, fit_max_tokens
from minisgl.engine import Engine, InFlight
from minisgl.utils import use_stream

from .cache import CacheManager
from .config import SchedulerConfig, read_eos_token_ids
from .decode import DecodeManager
from .prefill import ChunkedReq, PendingReq, PrefillManager
from .table import TableManager


class TokenOutput(NamedTuple):
    """One new token of one request, as each step reports it."""

    uid: int
    token: int
    finished: bool
    # It finished because `token` is an end-of-sequence token (not because of max_tokens):
    # the token is no text, and the reason the API reports is "stop".
    eos: bool = False


@dataclass
class StepTimes:
    """Wall time of the steps that launched one kind of batch. With overlap, a step launches
    one batch and then waits for the one before: in a steady run its time is the period
    between launches, whichever of the device and the host is slower."""

    steps: int = 0
    seconds: float = 0.0
    requests: int = 0  # summed over the steps: divided by `steps`, the mean batch size

    def add(self, seconds: float, requests: int) -> None:
        self.steps, self.seconds, self.requests = (
            self.steps + 1, self.seconds + seconds, self.requests + requests)


class Scheduler:
    """Chooses what the engine computes at each step: new requests' prompts (prefill), with
    one more token for every running request in the same batch (a mixed batch), otherwise that
    token alone (decode). With overlap, step() launches batch i+1 before it reads batch i's
    tokens, so the host's work runs while the device computes: lengths are known in advance
    and sampled tokens go straight into the device's token pool.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        # On a GPU the engine first runs a full prefill step, off every request.
        self.engine = Engine(config, warm_up_tokens=config.max_prefill_length)
        # The rows and pages the scheduler hands out (the engine keeps one of each spare).
        rows = config.max_running_req
        self.table = TableManager(self.engine.page_table[:rows], self.engine.token_pool[:rows])
        self.cache = CacheManager(self.engine.num_pages, self.engine.page_size,
                                  self.engine.page_table[:rows], config.cache_type)
        self.decode = DecodeManager(self.engine.page_size)
        self.prefill = PrefillManager(self.table, self.cache, self.decode,
                                      config.max_prefill_length)
        self.eos_token_ids = read_eos_token_ids(config.model_path)
        self.overlap = config.overlap
        self.in_flight: InFlight | None = None
        self.finished: set[Req] = set()  # done, but still inside the batch in flight
        self.prefill_computed_tokens = 0  # prompt tokens actually computed (statistics)
        self.step_times = {"prefill": StepTimes(), "decode": StepTimes()}

    def add_request(self, uid: int, input_ids: list[int] | torch.Tensor,
                    sampling_params: SamplingParams) -> None:
        """Queue a request; one that could never fit is rejected here, before it waits."""
        ids = torch.as_tensor(input_ids, dtype=torch.int32).flatten().cpu()
        fit_max_tokens(len(ids), sampling_params.max_tokens, self.engine.max_seq_len)
        self.prefill.add(PendingReq(uid, ids, sampling_params))

    @property
    def has_work(self) -> bool:
        return self.prefill.runnable or self.decode.runnable or self.in_flight is not None

    def step(self) -> list[TokenOutput]:
        """Launch the next batch, then report the tokens of the batch before it (with overlap)
        or of this one (without). Before a prefill, a decode batch in flight is read first."""
        # The host's device work (token pool and page table writes) goes to the engine's
        # preparation stream, which its forward waits for.
        start = time.perf_counter()
        with use_stream(self.engine.prepare_stream):
            batch = self._schedule()
            tokens = []
            if (self.in_flight is not None and batch is not None and batch.is_prefill
                    and self.in_flight.batch.is_decode):
                # An eager prefill's launch takes the host about as long as the device computes
                # it, while the decode graph in flight is done far sooner: its tokens would wait
                # for the whole launch. Read them first; the device idles only meanwhile. (A
                # prefill in flight lasts about as long as this launch: nothing to gain there.)
                tokens, self.in_flight = self._process(self.in_flight, batch.reqs), None
            launched = self._launch(batch) if batch is not None else None
            to_read, self.in_flight = ((self.in_flight, launched) if self.overlap
                                       else (launched, None))
            if to_read is not None:
                tokens = self._process(to_read, self.in_flight.batch.reqs if self.in_flight else [])
        if batch is not None:
            self.step_times[batch.phase].add(time.perf_counter() - start, batch.size)
        return tokens

    def _schedule(self) -> Batch | None:
        """Prompts first, and the running requests ride along: a prompt, or a long prompt's
        chunks, would otherwise stall every running request for as many steps as it takes.
        For the engine a running request is one more prefill of one token on a cached prefix."""
        prefill = self.prefill.schedule_next_batch()
        if prefill is None:
            return self.decode.schedule_next_batch()
        return Batch([*self.decode.running, *prefill.reqs], "prefill")

    def _launch(self, batch: Batch) -> InFlight:
        """Compute the batch; its requests' lengths are known now, their tokens later."""
        flight = self._compute(batch)
        for req in batch.reqs:
            req.complete_one()  # computed: cached now, and one new token is due
            if isinstance(req, ChunkedReq):
                continue
            if batch.is_prefill and req not in self.decode.running:  # its prompt is done: share it
                self._cache_req(req, finished=False)
            if req.can_decode and req not in self.finished:
                self.decode.add(req)
            else:  # it reached max_tokens in this batch: no further step may include it
                self.decode.remove(req)
        return flight

    def _compute(self, batch: Batch) -> InFlight:
        """Pages for the batch's new tokens, then the engine computes it (graph or not)."""
        self.cache.allocate(batch.reqs)
        if batch.is_prefill:  # its running requests compute one token each, not a prompt
            self.prefill_computed_tokens += sum(r.extend_len for r in batch.reqs
                                                if r not in self.decode.running)
        # A partial prompt's sampled token means nothing: it must not reach the token pool.
        sampled = [i for i, req in enumerate(batch.reqs) if not isinstance(req, ChunkedReq)]
        return self.engine.launch(batch, sampled)

    def _process(self, flight: InFlight, next_reqs: list[Req]) -> list[TokenOutput]:
        """Read a finished batch's tokens on the host: append them, detect the end of each
        request, and release what finished requests hold once no batch uses it any more
        (`next_reqs`: the batch launched, or about to be, after this one)."""
        # After this, no device work of the batch is pending: a row or page it used may be
        # handed to another request.
        flight.done.synchronize()
        still_used = set(next_reqs)
        results = []
        for req, token in zip(flight.batch.reqs, flight.output.next_tokens_host.tolist()):
            if req in self.finished:  # it ended (or was aborted) a step earlier
                self.finished.discard(req)
                self._free(req)
                continue
            if isinstance(req, ChunkedReq):
                continue  # its prompt is not complete: the sampled token means nothing
            req.append_host(token)
            # Judged on the host's tokens: with overlap the device lengths are a step ahead.
            eos = token in self.eos_token_ids and not req.sampling_params.ignore_eos
            finished = eos or len(req.input_ids) == req.max_device_len
            results.append(TokenOutput(req.uid, token, finished, eos))
            if finished:
                self.decode.remove(req)
                if req in still_used:
                    self.finished.add(req)
                else:
                    self._free(req)
        return results

    def abort(self, uid: int) -> bool:
        """Drop request `uid` wherever it is, giving back its page-table row and KV pages.
        False when there is no such request (it has finished already)."""
        for pending in self.prefill.pending:
            if pending.uid == uid:
                self.prefill.pending.remove(pending)
                if pending.chunk is not None:  # part of its prompt is computed: it holds a row
                    self._release(pending.chunk)
                return True
        for req in self.decode.running:
            if req.uid == uid:
                self.decode.remove(req)
                self._release(req)
                return True
        return False

    def _release(self, req: Req) -> None:
        """Free `req` now, or, if the batch in flight still computes it, once that batch is read."""
        if self.in_flight is not None and req in self.in_flight.batch.reqs:
            self.finished.add(req)
        else:
            self._free(req)

    def stats(self) -> dict[str, int]:
        """Counters for monitoring (and for tests: every page comes back once all is done)."""
        cache, page_size = self.cache.prefix_cache, self.engine.page_size
        return {"num_pages": self.engine.num_pages, "free_pages": len(self.cache.free_pages),
                "cached_pages": (cache.evictable_size + cache.protected_size) // page_size,
                "locked_pages": cache.protected_size // page_size,
                "running": len(self.decode.running), "waiting": len(self.prefill.pending),
                "rows_free": self.table.available,
                "evicted_pages": self.cache.evicted_pages,  # given to other requests, in all
                # Where the time goes (microseconds, so that every value is an int).
                **{f"{phase}_{name}": int(value) for phase, t in self.step_times.items()
                   for name, value in (("steps", t.steps), ("us", t.seconds * 1e6),
                                       ("requests", t.requests))}}

    def _free(self, req: Req) -> None:
        self._cache_req(req, finished=True)
        self.table.free(req.table_idx)

    def _cache_req(self, req: Req, finished: bool) -> None:
        """The prefix cache takes `req`'s pages: all once it finished, else its prompt's."""
        self.cache.cache_req(req, finished)
