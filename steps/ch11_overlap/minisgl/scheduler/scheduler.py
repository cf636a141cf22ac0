from __future__ import annotations

from typing import NamedTuple

import torch

from minisgl.core import Batch, Req, SamplingParams, fit_max_tokens
from minisgl.engine import Engine, ForwardOutput
from minisgl.utils import Event, create_event, create_stream, pin, use_stream

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
    done: Event  # fires once the batch's work on the device, token-pool write included, is over
    # What the engine's stream still reads after launch: tensors made on the scheduler's stream
    # and a pinned host buffer being copied. Holding them until `done` keeps the allocators
    # from handing their memory to the next step while the device still needs it.
    inputs: tuple[object, ...]


class Scheduler:
    """Chooses what the engine computes at each step: new requests' prompts (prefill), with
    one more token for every running request in the same batch (a mixed batch), otherwise that
    token alone (decode). With overlap, step() launches batch i+1 before it reads batch i's
    tokens, so the host's work runs while the device computes: lengths are known in advance
    and sampled tokens go straight into the device's token pool.
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
        or of this one (without)."""
        # The host's device work (page table, metadata, bookkeeping) goes to the scheduler's
        # stream; the forward runs on the engine's stream, ordered after it.
        with use_stream(self.stream):
            batch = self._schedule()
            launched = self._launch(batch, self._prepare(batch)) if batch is not None else None
            if not self.overlap:
                return self._process(launched, None) if launched else []
            to_read, self.in_flight = self.in_flight, launched
            return self._process(to_read, launched) if to_read else []

    def _schedule(self) -> Batch | None:
        """Prompts first, and the running requests ride along: a prompt, or a long prompt's
        chunks, would otherwise stall every running request for as many steps as it takes.
        For the engine a running request is one more prefill of one token on a cached prefix."""
        prefill = self.prefill.schedule_next_batch()
        if prefill is None:
            return self.decode.schedule_next_batch()
        return Batch([*self.decode.running, *prefill.reqs], "prefill")

    def _prepare(self, batch: Batch) -> torch.Tensor:
        """Slots for the new tokens, positions, KV write locations and attention metadata.
        Returns each token's page-table row, for reading its input id at launch."""
        self.cache.allocate(batch.reqs)
        device, reqs = self.engine.device, batch.reqs
        if batch.is_prefill:  # its running requests compute one token each, not a prompt
            self.prefill_computed_tokens += sum(r.extend_len for r in reqs
                                                if r not in self.decode.running)
        rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs]).to(device)
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]
                                    ).to(device)
        batch.out_loc = self.engine.page_table[rows, batch.positions].long()
        self.engine.attn_backend.prepare_metadata(batch)
        return rows

    def _launch(self, batch: Batch, rows: torch.Tensor) -> InFlight:
        args = self.engine.sampler.prepare(batch)
        self.engine.stream.wait_stream(self.stream)
        with use_stream(self.engine.stream):
            # Read on the engine's stream: the previous batch wrote its sampled tokens there.
            batch.input_ids = self.table.token_pool[rows, batch.positions].long()
            output = self.engine.forward_batch(batch, args)
        # Each sampled token is the next input of its request: leave it in the token pool.
        sampled = [i for i, req in enumerate(batch.reqs) if not isinstance(req, ChunkedReq)]
        # Pinned and non-blocking: a plain host-to-device copy would make the host wait for
        # the forward it has just launched, and nothing would overlap.
        index_host = pin(torch.tensor([[batch.reqs[i].table_idx for i in sampled],
                                       [batch.reqs[i].device_len for i in sampled],
                                       sampled], dtype=torch.long), self.engine.device)
        if sampled:
            with use_stream(self.engine.stream):
                index = index_host.to(self.engine.device, non_blocking=True)
                self.table.token_pool[index[0], index[1]] = output.next_tokens_device[index[2]]
        done = create_event(self.engine.device)
        done.record(self.engine.stream)
        for req in batch.reqs:  # lengths are known now, the tokens later
            req.complete_one()  # computed: cached now, and one new token is due
            if isinstance(req, ChunkedReq):
                continue
            if batch.is_prefill and req not in self.decode.running:  # its prompt is done: share it
                self.cache.cache_req(req, finished=False)
            if req.can_decode and req not in self.finished:
                self.decode.add(req)
            else:  # it reached max_tokens in this batch: no further step may include it
                self.decode.remove(req)
        return InFlight(batch, output, done, inputs=(rows, args, index_host))

    def _process(self, flight: InFlight, in_flight: InFlight | None) -> list[TokenOutput]:
        """Read a finished batch's tokens on the host: append them, detect the end of each
        request, and release what finished requests hold once no batch uses it any more."""
        # After this, no device work of the batch is pending: a row or page it used may be
        # handed to another request.
        flight.done.synchronize()
        still_used = set(in_flight.batch.reqs) if in_flight else set()
        results = []
        for req, token in zip(flight.batch.reqs, flight.output.next_tokens_host.tolist()):
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
