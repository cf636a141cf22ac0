from __future__ import annotations

from typing import NamedTuple

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, ForwardOutput
from minisgl.utils import create_stream, pin, use_stream

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


class InFlight(NamedTuple):
    """A launched batch whose sampled tokens have not been read on the host yet."""

    batch: Batch
    output: ForwardOutput


class Scheduler:
    """Chooses what the engine computes at each step: new requests' prompts first (prefill),
    otherwise one more token for every running request (decode). Requests join and leave the
    running set between steps while the others carry on: continuous batching.

    With overlap, step() launches batch i+1 before it reads batch i's tokens, so the host's
    work (scheduling, metadata, bookkeeping) runs while the device computes. That is possible
    because the next step's inputs never come from the host: lengths are known in advance and
    sampled tokens go straight into the device's token pool.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.engine = Engine(config)
        self.table = TableManager(self.engine.page_table)
        self.cache = CacheManager(self.engine.num_pages, self.engine.page_size,
                                  self.engine.page_table, config.cache_type)
        self.decode = DecodeManager(self.engine.page_size)
        self.prefill = PrefillManager(self.table, self.cache, self.decode,
                                      config.max_prefill_length)
        self.eos_token_ids = read_eos_token_ids(config.model_path)
        self.overlap = config.overlap
        # Metadata is prepared on a stream of its own; the engine's stream waits for it.
        self.stream = create_stream(self.engine.device)
        self.in_flight: InFlight | None = None
        self.finished: set[Req] = set()  # done, but still inside the batch in flight
        self.prefill_computed_tokens = 0  # prompt tokens actually computed (statistics)
        self.last_batch_chunked = False

    def add_request(self, uid: int, input_ids: list[int] | torch.Tensor,
                    sampling_params: SamplingParams) -> None:
        """Queue a request; one that could never fit is rejected here, before it waits."""
        ids = torch.as_tensor(input_ids, dtype=torch.int32).flatten().cpu()
        if len(ids) == 0:
            raise ValueError(f"request {uid} has an empty prompt")
        self.engine.check_request_fits(len(ids), sampling_params.max_tokens)
        self.prefill.add(PendingReq(uid, ids, sampling_params))

    @property
    def has_work(self) -> bool:
        return self.prefill.runnable or self.decode.runnable or self.in_flight is not None

    def step(self) -> list[TokenOutput]:
        """Launch the next batch, then report the tokens of the batch before it (with overlap)
        or of this one (without)."""
        with use_stream(self.stream):
            batch = self._schedule()
            if batch is not None:
                self._prepare(batch)
        launched = self._launch(batch) if batch is not None else None
        if not self.overlap:
            return self._process(launched, None) if launched else []
        done, self.in_flight = self.in_flight, launched
        return self._process(done, launched) if done else []

    def _schedule(self) -> Batch | None:
        # Prefill first, except right after a chunk of a long prompt: then running requests
        # get a decode step, so a long prompt cannot stall them for many steps.
        if self.last_batch_chunked and self.decode.runnable:
            batch = self.decode.schedule_next_batch()
        else:
            batch = self.prefill.schedule_next_batch() or self.decode.schedule_next_batch()
        if batch is not None:
            self.last_batch_chunked = any(isinstance(r, ChunkedReq) for r in batch.reqs)
        return batch

    def _prepare(self, batch: Batch) -> None:
        """Slots for the new tokens, positions, KV write locations and attention metadata."""
        self.cache.allocate(batch.reqs)
        device, reqs = self.engine.device, batch.reqs
        if batch.is_prefill:
            self.prefill_computed_tokens += sum(r.extend_len for r in reqs)
        rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs]).to(device)
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]
                                    ).to(device)
        batch.out_loc = self.engine.page_table[rows, batch.positions].long()
        batch.input_ids = self.table.token_pool[rows, batch.positions].long()
        self.engine.attn_backend.prepare_metadata(batch)

    def _launch(self, batch: Batch) -> InFlight:
        self.engine.stream.wait_stream(self.stream)
        args = self.engine.sampler.prepare(batch)
        output = self.engine.forward_batch(batch, args)  # also advances each req's lengths
        # Each sampled token is the next input of its request: leave it in the token pool.
        sampled = [i for i, req in enumerate(batch.reqs) if not isinstance(req, ChunkedReq)]
        if sampled:
            rows = [batch.reqs[i].table_idx for i in sampled]
            cols = [batch.reqs[i].device_len - 1 for i in sampled]
            # Pinned and non-blocking: a plain host-to-device copy would make the host wait
            # for the forward it has just launched, and nothing would overlap.
            index = pin(torch.tensor([rows, cols, sampled]), self.engine.device)
            with use_stream(self.engine.stream):
                index = index.to(self.engine.device, non_blocking=True)
                self.table.token_pool[index[0], index[1]] = output.next_tokens_device[index[2]]
        for req in batch.reqs:  # lengths are known now, the tokens later
            if isinstance(req, ChunkedReq):
                continue
            if batch.is_prefill:  # its prompt is on the host: share it before the next step
                self.cache.cache_req(req, finished=False)
            if req.can_decode and req not in self.finished:
                self.decode.add(req)
            else:  # it reached max_tokens in this batch: no further step may include it
                self.decode.remove(req)
        return InFlight(batch, output)

    def _process(self, done: InFlight, in_flight: InFlight | None) -> list[TokenOutput]:
        """Read a finished batch's tokens on the host: append them, detect the end of each
        request, and release what finished requests hold once no batch uses it any more."""
        done.output.copy_done.synchronize()
        still_used = set(in_flight.batch.reqs) if in_flight else set()
        results = []
        for req, token in zip(done.batch.reqs, done.output.next_tokens_host.tolist()):
            if isinstance(req, ChunkedReq):
                continue  # its prompt is not complete: the sampled token means nothing
            if req in self.finished:  # it ended a step earlier; this was one step too many
                self.finished.discard(req)
                self._free(req)
                continue
            req.append_host(token)
            # Judged on the host's tokens: with overlap the device lengths are a step ahead.
            finished = len(req.input_ids) == req.max_device_len or (
                token in self.eos_token_ids and not req.sampling_params.ignore_eos)
            results.append(TokenOutput(req.uid, token, finished))
            if finished:
                self.decode.remove(req)
                if req in still_used:
                    self.finished.add(req)
                else:
                    self._free(req)
        return results

    def _free(self, req: Req) -> None:
        self.cache.cache_req(req, finished=True)
        self.table.free(req.table_idx)
