from __future__ import annotations

import gc
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from minisgl.attention import create_attention_backend, resolve_attention_backend
from minisgl.core import (Batch, Context, Req, SamplingParams, get_global_ctx,
                          set_global_ctx)
from minisgl.distributed import TPInfo, destroy_distributed, init_distributed
from minisgl.kvcache import MHAKVPool
from minisgl.models import ModelConfig, load_model
from minisgl.utils import (Event, configure_threads, create_event, create_stream, current_stream,
                           pick_device, pin, synchronize, use_stream)
from minisgl.utils.ragged import ragged_arange

from .config import EngineConfig
from .graph import GraphRunner, capture_batch_sizes
from .sampler import Sampler, SamplingArgs


class InFlight(NamedTuple):
    """A launched batch whose sampled tokens have not been read on the host yet."""

    batch: Batch
    output: ForwardOutput
    done: Event  # fires once all of the batch's device work, token-pool write included, is over
    # Tensors made on the preparation stream that the engine's stream still reads, and pinned
    # buffers being copied: held until `done`, so their memory is not handed out meanwhile.
    inputs: tuple[object, ...]


class ForwardOutput(NamedTuple):
    next_tokens_device: torch.Tensor  # [batch] the sampled tokens, on the device
    next_tokens_host: torch.Tensor  # [batch] the same, on the host once copy_done has fired
    copy_done: Event


class Engine:
    """Owns everything one forward needs — model, KV pool, page table, attention backend and
    sampler — and runs batches that someone else (a main, later the scheduler) prepared."""

    def __init__(self, config: EngineConfig, warm_up_tokens: int | None = None) -> None:
        """`warm_up_tokens`: the largest prefill the caller will run (the scheduler's budget).
        On a GPU the constructor runs one of that size and collects garbage before it returns,
        so that no request pays these one-time costs (`warm_up`)."""
        # How to put back each process-wide setting the constructor changes, oldest first.
        self._undo: list[Callable[[], None]] = []
        try:
            self._build(config, warm_up_tokens)
        except BaseException:  # half-built: leave the process as we found it
            self.close()
            raise

    def close(self) -> None:
        """Undo, newest first, what the constructor did to the process (the global Context, the
        TP rank and group, the CPU threads, the CUDA device). Safe to call twice."""
        while self._undo:
            self._undo.pop()()

    def _build(self, config: EngineConfig, warm_up_tokens: int | None) -> None:
        """The steps in order: each uses what the ones before it built."""
        self._set_up_device(config)
        # All or nothing: a failure leaves no rank or group behind.
        self.comm = init_distributed(self.tp, self.device, config.dist_init_address)
        self._undo.append(destroy_distributed)
        self.stream = create_stream(self.device)
        self._choose_backends(config)
        self.model = load_model(config.model_path, config.dtype, self.device)  # our shards
        self._allocate_kv_pool(config)
        self._allocate_tables(config)
        self._install_context(config)
        self.sampler = Sampler(self.device, self.model.config.vocab_size, config.seed)
        self.prepare_stream = create_stream(self.device)  # host work ahead of the forward
        self.graphs = self._capture_graphs(config, self.model.config.vocab_size)
        # Graphs hold NCCL work at TP > 1: they go before the process group does.
        self._undo.append(self._drop_graphs)
        # Everything above ran on the current stream, which the engine's streams do not wait
        # for: a page table still being zeroed would hand the first batch old slots.
        synchronize(self.device)
        if warm_up_tokens is not None and self.device.type == "cuda":
            self.warm_up(warm_up_tokens)
            # The first full collection walks every object the imports, the model and the
            # graphs made, a pause of a fraction of a second: now, before any request.
            gc.collect()

    def _set_up_device(self, config: EngineConfig) -> None:
        """This rank's device, and as many CPU threads as this process computes well with."""
        self.tp = TPInfo(config.tp_rank, config.tp_size)
        self.device = pick_device(config.device)
        if self.device.type == "cuda":
            if self.tp.size > 1:  # one GPU per rank
                if self.tp.size > torch.cuda.device_count():
                    raise ValueError(f"TP size {self.tp.size} needs {self.tp.size} GPUs; "
                                     f"{torch.cuda.device_count()} are visible")
                self.device = torch.device("cuda", self.tp.rank)
            elif self.device.index is None:
                self.device = torch.device("cuda", 0)
            self._undo.append(partial(torch.cuda.set_device, torch.cuda.current_device()))
            torch.cuda.set_device(self.device)
        self._undo.append(partial(torch.set_num_threads, torch.get_num_threads()))
        self.num_threads = configure_threads(self.device, self.tp.size)

    def _choose_backends(self, config: EngineConfig) -> None:
        """Before any weight is read: a backend that cannot run here is an error message now,
        not a crash inside the first forward."""
        self.attention_backend_name = resolve_attention_backend(
            config.attention_backend, self.device, config.dtype,
            ModelConfig.from_dir(config.model_path).head_dim)

    def _allocate_kv_pool(self, config: EngineConfig) -> None:
        """As many KV pages as the memory budget holds, and the longest request they allow."""
        model_config = self.model.config
        self.page_size = config.page_size
        kv_heads = model_config.num_kv_heads // self.tp.size  # this rank's KV heads only
        page_bytes = MHAKVPool.page_bytes(model_config.num_layers, config.page_size, kv_heads,
                                          model_config.head_dim, config.dtype)
        # Every rank must see the same pool size, or their schedulers would decide differently.
        self.num_pages = self.comm.min_over_ranks(
            config.num_page_override or self._pages_that_fit(config, page_bytes) - 1)
        # One page more than the scheduler hands out: where the padding rows of a replayed
        # decode graph write their K and V (chapter 18). A memory budget pays for it (hence the
        # - 1 above); an explicit page count is the scheduler's alone.
        self.kv_pool = MHAKVPool(model_config.num_layers, self.num_pages + 1, config.page_size,
                                 kv_heads, model_config.head_dim, config.dtype, self.device)
        # A request can never hold more tokens than the pool, nor more than RoPE was built for.
        self.max_seq_len = min(config.max_seq_len_override or model_config.max_position,
                               model_config.max_position, self.num_pages * config.page_size)

    def _allocate_tables(self, config: EngineConfig) -> None:
        """The tables with one row a request. page_table[row, i] = KV-pool slot of token i of
        the request in that row. Whole pages are written at once, so the width is rounded up
        to a multiple of page_size. token_pool[row, i] is token i of that row's request: each
        step reads its input ids there and writes its sampled tokens back, on the device."""
        width = -(-self.max_seq_len // config.page_size) * config.page_size
        # One row more than the scheduler hands out, pointing at the spare page: the padding
        # rows of a replayed decode graph.
        self.page_table = torch.zeros(config.max_running_req + 1, width, dtype=torch.int32,
                                      device=self.device)
        self.dummy_row = config.max_running_req
        self.page_table[self.dummy_row] = self.num_pages * config.page_size
        self.token_pool = torch.zeros_like(self.page_table)

    def _install_context(self, config: EngineConfig) -> None:
        """The attention backend over the pool and the page table, in the process-global
        Context that the model's layers read."""
        self.attn_backend = create_attention_backend(
            self.attention_backend_name, self.kv_pool, self.page_table,
            self.model.config.num_q_heads // self.tp.size)  # this rank's query heads
        self.ctx = Context(attn_backend=self.attn_backend)
        set_global_ctx(self.ctx)
        self._undo.append(self._uninstall_ctx)

    def _drop_graphs(self) -> None:
        if self.graphs is not None:
            self.graphs.close()
        self.graphs = None

    def _capture_graphs(self, config: EngineConfig, vocab_size: int) -> GraphRunner | None:
        """Real CUDA graphs on a GPU with a FlashInfer backend ("auto"), emulated ones anywhere
        ("emulate"), none ("off"; or the torch backend on a GPU, whose graph decode attends
        over the whole max_seq_len and is only there for the emulation)."""
        emulate = config.cuda_graph == "emulate"
        if config.cuda_graph == "off" or (not emulate and (
                self.device.type != "cuda" or self.attention_backend_name == "torch")):
            return None
        max_bs = min(config.cuda_graph_max_bs or config.max_running_req, config.max_running_req)
        sizes = capture_batch_sizes(max_bs)
        self.attn_backend.init_graph(max(sizes), self.dummy_row)
        start = time.perf_counter()
        free_before = self._free_device_memory() if not emulate else 0
        with torch.no_grad():
            runner = GraphRunner(self.model, self.ctx, self.attn_backend, self.page_table,
                                 self.token_pool, sizes, vocab_size, self.dummy_row, emulate,
                                 dtype=config.dtype)
        self.graph_capture_seconds = time.perf_counter() - start
        self.graph_memory_bytes = free_before - self._free_device_memory() if not emulate else 0
        return runner

    def _free_device_memory(self) -> int:
        # Cached blocks nobody uses (the loader's temporaries) go back first, or the measure
        # would count their release against the graphs.
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(self.device)[0]

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
        else:  # the ranks share the machine's memory: the budget is for all of them
            budget = config.cpu_kv_cache_bytes // self.tp.size
        num_pages = budget // page_bytes
        if num_pages < 2:  # the scheduler's one, and the graphs' spare
            raise ValueError(f"a KV page needs {page_bytes:,} bytes; the budget is {budget:,}, "
                             f"and two pages are the least")
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
            return self._sample(batch, logits, args)

    def _sample(self, batch: Batch, logits: torch.Tensor,
                args: SamplingArgs | None) -> ForwardOutput:
        next_tokens = self.sampler.sample(logits, args).to(torch.int32)
        next_tokens_host = pin(torch.empty_like(next_tokens, device="cpu"), self.device)
        next_tokens_host.copy_(next_tokens, non_blocking=True)
        copy_done = create_event(self.device)
        copy_done.record(self.stream)
        return ForwardOutput(next_tokens, next_tokens_host, copy_done)

    def launch(self, batch: Batch, sampled: list[int]) -> InFlight:
        """Compute one batch whose pages are allocated; the tokens sampled for the requests at
        `sampled` go into the token pool as their next inputs."""
        reqs = batch.reqs
        padded = self.graphs.padded_size(batch) if self.graphs is not None else None
        with use_stream(self.prepare_stream):
            # Token t belongs to request r: its row, and positions cached_len_r + i; copied
            # in one pinned transfer. A decode batch has one token a request: no arange.
            if batch.is_decode:
                where = torch.tensor([[r.table_idx for r in reqs], [r.cached_len for r in reqs]])
            else:
                owner, positions = ragged_arange(torch.tensor([r.cached_len for r in reqs]),
                                                 torch.tensor([r.extend_len for r in reqs]))
                where = torch.stack([torch.tensor([r.table_idx for r in reqs])[owner],
                                     positions])
            rows, batch.positions = pin(where, self.device).to(self.device, non_blocking=True)
            if padded is None:
                batch.out_loc = self.page_table[rows, batch.positions].long()
                self.attn_backend.prepare_metadata(batch)
                if self.graphs is not None:  # the LM head meets only shapes seen before
                    self.graphs.pad_scored_rows(batch)
            args = self.sampler.prepare(batch)
            # Where each sampled token goes: the row and position of its request's next input.
            index_host = pin(torch.tensor([[reqs[i].table_idx for i in sampled],
                                           [reqs[i].device_len for i in sampled], sampled],
                                          dtype=torch.long), self.device)
        self.stream.wait_stream(self.prepare_stream)
        with use_stream(self.stream), torch.no_grad():
            if padded is None:
                # Read on the engine's stream: the previous batch wrote its tokens there.
                batch.input_ids = self.token_pool[rows, batch.positions].long()
                with self.ctx.forward_batch(batch):
                    logits = self.model.forward()[: batch.size]  # the padding rows stay behind
            else:  # the graph reads rows and positions from its static buffers
                logits = self.graphs.replay(batch, rows, batch.positions, padded)  # type: ignore
            output = self._sample(batch, logits, args)
            if sampled:
                index = index_host.to(self.device, non_blocking=True)
                self.token_pool[index[0], index[1]] = output.next_tokens_device[index[2]]
            done = create_event(self.device)
            done.record(self.stream)
        return InFlight(batch, output, done, inputs=(rows, args, index_host))

    def warm_up(self, num_tokens: int) -> None:
        """One eager prefill of `num_tokens` tokens before any request, so that none pays for
        the first forward at the largest shape (cuBLAS picking kernels, the allocator reserving
        activations). The tokens sit on the spare row and page, cut into requests of at most
        max_seq_len: no row, page or request of the scheduler's is touched."""
        sizes = [min(self.max_seq_len, num_tokens - start)
                 for start in range(0, num_tokens, self.max_seq_len)]
        reqs = [Req(torch.zeros(n, dtype=torch.int32), table_idx=self.dummy_row, cached_len=0,
                    output_len=1, uid=-1, sampling_params=SamplingParams()) for n in sizes]
        try:
            self.launch(Batch(reqs, "prefill"), sampled=[]).done.synchronize()
        except torch.OutOfMemoryError as e:  # at start, not in the middle of serving
            raise RuntimeError(f"a prefill step of {num_tokens:,} tokens does not fit in the "
                               f"device memory the KV pool leaves: lower max_prefill_length or "
                               f"memory_ratio") from e
