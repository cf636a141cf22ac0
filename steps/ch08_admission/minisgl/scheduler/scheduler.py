from __future__ import annotations

from typing import NamedTuple

import torch

from minisgl.core import Batch, Req, SamplingParams, fit_max_tokens
from minisgl.engine import Engine, ForwardOutput

from .cache import CacheManager
from .config import SchedulerConfig, read_eos_token_ids
from .decode import DecodeManager
from .prefill import PendingReq, PrefillManager
from .table import TableManager


class TokenOutput(NamedTuple):
    """One new token of one request, as each step reports it."""

    uid: int
    token: int
    finished: bool


class Scheduler:
    """Chooses what the engine computes at each step: new requests' prompts first (prefill),
    otherwise one more token for every running request (decode). Requests join and leave the
    running set between steps while the others carry on: continuous batching."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.engine = Engine(config)
        self.table = TableManager(config.max_running_req)
        self.cache = CacheManager(self.engine.num_pages, self.engine.page_size,
                                  self.engine.page_table)
        self.decode = DecodeManager(self.engine.page_size)
        self.prefill = PrefillManager(self.table, self.cache, self.decode)
        self.eos_token_ids = read_eos_token_ids(config.model_path)

    def add_request(self, uid: int, input_ids: list[int] | torch.Tensor,
                    sampling_params: SamplingParams) -> None:
        """Queue a request; one that could never fit is rejected here, before it waits."""
        ids = torch.as_tensor(input_ids, dtype=torch.int32).flatten().cpu()
        fit_max_tokens(len(ids), sampling_params.max_tokens, self.engine.max_seq_len)
        self.prefill.add(PendingReq(uid, ids, sampling_params))

    @property
    def has_work(self) -> bool:
        return self.prefill.runnable or self.decode.runnable

    def step(self) -> list[TokenOutput]:
        """Schedule one batch, run it, and report each request's new token."""
        batch = self.prefill.schedule_next_batch() or self.decode.schedule_next_batch()
        if batch is None:
            return []
        self._prepare(batch)
        output = self.engine.forward_batch(batch, self.engine.sampler.prepare(batch))
        for req in batch.reqs:  # computed: cached now, and one new token is due
            req.complete_one()
        return self._process(batch, output)

    def _prepare(self, batch: Batch) -> None:
        """Slots for the new tokens, then the flat token tensors and the attention metadata."""
        self.cache.allocate(batch.reqs)
        device, reqs = self.engine.device, batch.reqs
        batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]
                                    ).to(device, torch.long)
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]
                                    ).to(device)
        table = self.engine.page_table
        batch.out_loc = torch.cat([table[r.table_idx, r.cached_len : r.device_len] for r in reqs]
                                  ).long()
        self.engine.attn_backend.prepare_metadata(batch)

    def _process(self, batch: Batch, output: ForwardOutput) -> list[TokenOutput]:
        output.copy_done.synchronize()
        results = []
        for req, token in zip(batch.reqs, output.next_tokens_host.tolist()):
            req.append_host(token)
            finished = not req.can_decode or (
                token in self.eos_token_ids and not req.sampling_params.ignore_eos)
            results.append(TokenOutput(req.uid, token, finished))
            if finished:
                if batch.is_decode:
                    self.decode.remove(req)
                self._free(req)
            elif batch.is_prefill:
                self.decode.add(req)
        return results

    def _free(self, req: Req) -> None:
        self.cache.free(req)
        self.table.free(req.table_idx)
