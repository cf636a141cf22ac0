from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, get_global_ctx, set_global_ctx
from minisgl.kvcache import MHAKVPool
from minisgl.models import load_model
from minisgl.utils import (Event, configure_threads, create_event, create_stream, current_stream,
                           pick_device, pin, synchronize, use_stream)

from .config import EngineConfig
from .sampler import Sampler, SamplingArgs


class ForwardOutput(NamedTuple):
    next_tokens_device: torch.Tensor  # [batch] the sampled tokens, on the device
    next_tokens_host: torch.Tensor  # [batch] the same, on the host once copy_done has fired
    copy_done: Event


class Engine:
    """Owns everything one forward needs — model, KV pool, page table, attention backend and
    sampler — and runs batches that someone else (a main, later the scheduler) prepared."""

    def __init__(self, config: EngineConfig) -> None:
        # How to put back each process-wide setting the constructor changes, oldest first.
        self._undo: list[Callable[[], None]] = []
        try:
            self._build(config)
        except BaseException:  # half-built: leave the process as we found it
            self.close()
            raise

    def close(self) -> None:
        """Undo, newest first, what the constructor did to the process (the global Context,
        the CPU threads). Safe to call twice."""
        while self._undo:
            self._undo.pop()()

    def _build(self, config: EngineConfig) -> None:
        """The steps in order: each uses what the ones before it built."""
        self._set_up_device(config)
        self.stream = create_stream(self.device)
        self.model = load_model(config.model_path, config.dtype, self.device)
        self._allocate_kv_pool(config)
        self._allocate_tables(config)
        self._install_context(config)
        self.sampler = Sampler(self.device, self.model.config.vocab_size, config.seed)
        # Everything above ran on the current stream, which the engine's streams do not wait
        # for: a page table still being zeroed would hand the first batch old slots.
        synchronize(self.device)

    def _set_up_device(self, config: EngineConfig) -> None:
        """The device, and as many CPU threads as this process computes well with."""
        self.device = pick_device(config.device)
        self._undo.append(partial(torch.set_num_threads, torch.get_num_threads()))
        self.num_threads = configure_threads(self.device)

    def _allocate_kv_pool(self, config: EngineConfig) -> None:
        """As many KV pages as the memory budget holds, and the longest request they allow."""
        model_config = self.model.config
        self.page_size = config.page_size
        page_bytes = MHAKVPool.page_bytes(model_config.num_layers, config.page_size,
                                          model_config.num_kv_heads, model_config.head_dim,
                                          config.dtype)
        self.num_pages = config.num_page_override or self._pages_that_fit(config, page_bytes)
        self.kv_pool = MHAKVPool(model_config.num_layers, self.num_pages, config.page_size,
                                 model_config.num_kv_heads, model_config.head_dim, config.dtype,
                                 self.device)
        # A request can never hold more tokens than the pool, nor more than RoPE was built for.
        self.max_seq_len = min(config.max_seq_len_override or model_config.max_position,
                               model_config.max_position, self.kv_pool.num_slots)

    def _allocate_tables(self, config: EngineConfig) -> None:
        """The tables with one row a request. page_table[row, i] = KV-pool slot of token i of
        the request in that row. Whole pages are written at once, so the width is rounded up
        to a multiple of page_size."""
        width = -(-self.max_seq_len // config.page_size) * config.page_size
        self.page_table = torch.zeros(config.max_running_req, width, dtype=torch.int32,
                                      device=self.device)

    def _install_context(self, config: EngineConfig) -> None:
        """The attention backend over the pool and the page table, in the process-global
        Context that the model's layers read."""
        self.attn_backend = create_attention_backend(config.attention_backend, self.kv_pool,
                                                     self.page_table)
        self.ctx = Context(attn_backend=self.attn_backend)
        set_global_ctx(self.ctx)
        self._undo.append(self._uninstall_ctx)

    def _uninstall_ctx(self) -> None:
        # Only if it is still ours: an engine created since has installed its own.
        try:
            installed = get_global_ctx()
        except RuntimeError:  # none installed
            return
        if installed is self.ctx:
            set_global_ctx(None)  # it points at our KV pool: let the pool be freed

    def _pages_that_fit(self, config: EngineConfig, page_bytes: int) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * config.memory_ratio)
        else:
            budget = config.cpu_kv_cache_bytes
        num_pages = budget // page_bytes
        if num_pages < 1:
            raise ValueError(f"a KV page needs {page_bytes:,} bytes; the budget is {budget:,}")
        return num_pages

    def forward_batch(self, batch: Batch, args: SamplingArgs | None) -> ForwardOutput:
        """Run the model on a prepared batch (inputs and attention metadata set), sample one
        token per request and start copying them to the host. The requests are the caller's."""
        caller = current_stream(self.device)  # where the caller wrote the batch
        if caller != self.stream:  # a scheduler already on the engine's stream has waited
            self.stream.wait_stream(caller)
        with use_stream(self.stream), torch.no_grad():
            with self.ctx.forward_batch(batch):
                logits = self.model.forward()
            next_tokens = self.sampler.sample(logits, args).to(torch.int32)
            next_tokens_host = pin(torch.empty_like(next_tokens, device="cpu"), self.device)
            next_tokens_host.copy_(next_tokens, non_blocking=True)
            copy_done = create_event(self.device)
            copy_done.record(self.stream)
        return ForwardOutput(next_tokens, next_tokens_host, copy_done)
