"""CUDA graphs for decode: the forward captured once per batch size, replayed with one launch;
on the CPU, an emulation with the same rules. A replay reuses the capture's addresses and
shapes, so whatever a step changes must be copied into the static buffers."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from minisgl.attention import BaseAttentionBackend
from minisgl.core import Batch, Context, Req, SamplingParams


class CudaGraph:
    """torch.cuda.CUDAGraph: kernels recorded once, replayed with one launch."""

    def __init__(self, step: Callable[[], None], pool: object, stream: torch.cuda.Stream) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            step()
        # The graph holds raw addresses, not tensors: whatever the captured step read must
        # outlive it. The step's closure holds the static batch and its attention metadata
        # (each request's last row, for one); dropped, their memory would go to other tensors
        # and the replay would read whatever those hold.
        self.step = step

    def replay(self) -> None:
        self.graph.replay()


class EmulatedGraph:
    """The CPU's stand-in: a replay re-runs the captured step on the capture-time objects, so
    what a real replay would miss (an input not copied into a static buffer) it misses too."""

    def __init__(self, step: Callable[[], None], pool: object = None, stream: object = None) -> None:
        self.step = step
        step()  # as a capture runs the step once

    def replay(self) -> None:
        self.step()


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_bs (and max_bs itself): a decode batch is padded to
    the next size, so the padding costs at most 15 rows beyond 8."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs < max_bs] + list(range(16, max_bs, 16))
    return sorted(set(sizes) | {max_bs})


class GraphRunner:
    """The decode forward captured for each of `batch_sizes`; a batch of n replays the smallest
    size >= n, its extra rows pointing at the spare page-table row. Static buffers: each
    token's page-table row and position (input ids and KV slots are read from them inside the
    graph), the backend's metadata, and the logits."""

    def __init__(self, model: object, ctx: Context, backend: BaseAttentionBackend,
                 page_table: torch.Tensor, token_pool: torch.Tensor, batch_sizes: list[int],
                 vocab_size: int, dummy_row: int, emulate: bool, dtype: torch.dtype) -> None:
        self.model, self.ctx, self.backend = model, ctx, backend
        self.page_table, self.token_pool = page_table, token_pool
        self.batch_sizes, self.dummy_row = batch_sizes, dummy_row
        device = page_table.device
        max_bs = max(batch_sizes)
        self.rows = torch.full((max_bs,), dummy_row, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.logits = torch.zeros(max_bs, vocab_size, dtype=dtype, device=device)
        self.graphs: dict[int, CudaGraph | EmulatedGraph] = {}
        make = EmulatedGraph if emulate else CudaGraph
        pool = None if emulate else torch.cuda.graph_pool_handle()  # shared by all sizes
        stream = None if emulate else torch.cuda.Stream(device)
        # Largest first: its memory is reused by the smaller graphs from the shared pool.
        for i, bs in enumerate(sorted(batch_sizes, reverse=True)):
            print(f"\rcapturing decode graphs: batch {bs:>4} ({i + 1}/{len(batch_sizes)})",
                  end="", file=sys.stderr, flush=True)
            batch = self._static_batch(bs)
            if not emulate:
                # The side stream starts after what the current one holds (the backend's
                # capture-time plan copies its metadata into the static buffers there).
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):  # warm-up: lazy initialisation stays out
                    self._step(batch)
                torch.cuda.current_stream(device).wait_stream(stream)
            self.graphs[bs] = make(lambda batch=batch: self._step(batch), pool, stream)
        print(file=sys.stderr)

    def _static_batch(self, bs: int) -> Batch:
        reqs = [Req(torch.zeros(1, dtype=torch.int32), table_idx=self.dummy_row, cached_len=0,
                    output_len=1, uid=-1, sampling_params=SamplingParams()) for _ in range(bs)]
        batch = Batch(reqs, "decode")
        batch.positions = self.positions[:bs]
        batch.attn_metadata = self.backend.capture_metadata(bs)  # type: ignore[assignment]
        return batch

    def _step(self, batch: Batch) -> None:
        """One decode forward that reads only static tensors: the graph's body."""
        rows, positions = self.rows[: batch.size], batch.positions
        batch.input_ids = self.token_pool[rows, positions].long()
        batch.out_loc = self.page_table[rows, positions].long()
        self.backend.prepare_in_graph(rows, positions)
        with self.ctx.forward_batch(batch):
            logits = self.model.forward()  # type: ignore[attr-defined]
        self.logits[: batch.size].copy_(logits)

    def close(self) -> None:
        """Drop the graphs now: each holds its step, which holds this runner, a cycle that
        would keep the graphs' memory pool and the KV pool alive until the collector runs."""
        self.graphs.clear()

    def padded_size(self, batch: Batch) -> int | None:
        """The captured size this batch replays at, or None: run it eagerly."""
        return self._captured_size(batch.size) if batch.is_decode else None

    def _captured_size(self, n: int) -> int | None:
        """The smallest captured size that holds n rows (None: more than the largest)."""
        return next((bs for bs in self.batch_sizes if bs >= n), None)

    def pad_scored_rows(self, batch: Batch) -> None:
        """Pad an eager batch's rows for the LM head (its last_indices) to the next captured
        size, repeating row 0 (its logits are dropped): cuBLAS spends milliseconds of host time
        on each new shape, and the capture's warm-up met these sizes already."""
        meta = batch.attn_metadata
        n = len(meta.last_indices)
        size = self._captured_size(n) or n
        if size > n:
            meta.last_indices = torch.nn.functional.pad(meta.last_indices, (0, size - n))

    def replay(self, batch: Batch, rows: torch.Tensor, positions: torch.Tensor,
               padded: int) -> torch.Tensor:
        """Copy the batch into the static buffers, replay, return its rows of logits. Runs on
        the stream the forward runs on, after the previous replay: the buffers are free."""
        n = batch.size
        self.rows[:n].copy_(rows)
        self.rows[n:padded].fill_(self.dummy_row)
        self.positions[:n].copy_(positions)
        self.positions[n:padded].zero_()
        self.backend.prepare_replay(batch, padded)
        self.graphs[padded].replay()
        return self.logits[:n]
