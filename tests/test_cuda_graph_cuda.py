"""CUDA graphs on a real GPU (skipped without CUDA or without flashinfer): a graph keeps alive
what its step read, and replayed decode steps give the eager tokens with each GPU backend."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import SMOLLM2, TINY_QWEN3
from gpu_helpers import PROMPTS, assert_same_up_to_near_ties, backends, require_weights
from minisgl.core import SamplingParams
from minisgl.engine.graph import CudaGraph
from minisgl.llm import LLM

CHAPTER = 18

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                       reason="needs flashinfer-python (pip install -e '.[gpu]')"),
]


def test_a_graph_keeps_alive_what_its_step_reads():
    """The step reads an index tensor that only its closure holds. A graph replays raw
    addresses: if that tensor were freed after the capture, the allocator would hand its memory
    to the next tensors of the same size (here filled with 7) and the replay would read them."""
    table = torch.randn(8, 64, device="cuda")
    out = torch.zeros(8, device="cuda")

    def make_step():
        index = torch.arange(8, device="cuda")  # held by the closure alone
        return lambda: torch.sum(table[index], dim=1, out=out)

    graph = CudaGraph(make_step(), torch.cuda.graph_pool_handle(), torch.cuda.Stream())
    reuse = [torch.full((8,), 7, device="cuda") for _ in range(64)]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, table.sum(dim=1)), "the replay read freed memory"
    del reuse


def generate(path, attn: str, cuda_graph: str) -> list[list[int]]:
    # Twelve requests of different lengths: as they finish, decode batches shrink through
    # several captured sizes (12, 8, 4, 2, 1) and are padded in between.
    llm = LLM(str(path), dtype=torch.bfloat16, attention_backend=attn, cuda_graph=cuda_graph,
              max_running_req=12, max_seq_len_override=512, num_page_override=4096,
              device="cuda")
    try:
        outs = llm.generate(PROMPTS * 3, [SamplingParams(max_tokens=6 + 3 * i, ignore_eos=True)
                                          for i in range(12)])
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


@pytest.mark.parametrize("name", backends())
def test_replayed_decode_gives_the_eager_tokens(models_dir, name):
    """Greedy bfloat16 tokens with graphs equal those without, up to near ties: a graph's
    FlashInfer decode is planned for CUDA graphs (the KV split into chunks whatever the batch),
    so its sums may run in another order than the eager kernel's."""
    path = require_weights(models_dir / SMOLLM2)
    assert_same_up_to_near_ties(path, PROMPTS * 3, generate(path, name, "off"),
                                generate(path, name, "auto"), f"{name} graphs")


def test_the_scheduler_warms_up_a_full_prefill_step(models_dir, monkeypatch):
    """On a GPU the scheduler's engine runs one prefill of max_prefill_length tokens before
    any request, on the spare row: every row and page is still free, and the tokens that
    follow are those of a scheduler that did not warm up."""
    from minisgl.engine import Engine

    path = require_weights(models_dir / TINY_QWEN3)
    launched: list[int] = []
    launch = Engine.launch

    def counted(self, batch, sampled):  # type: ignore[no-untyped-def]
        launched.append(sum(r.extend_len for r in batch.reqs))
        return launch(self, batch, sampled)

    def run(warm: bool) -> list[list[int]]:
        if not warm:
            monkeypatch.setattr(Engine, "warm_up", lambda self, n: None)
        llm = LLM(str(path), dtype=torch.bfloat16, max_running_req=4, max_prefill_length=300,
                  max_seq_len_override=128, num_page_override=64, page_size=16, device="cuda")
        try:
            scheduler = llm.backend.scheduler  # type: ignore[union-attr]
            stats = scheduler.stats()
            assert stats["free_pages"] == 64 and stats["rows_free"] == 4
            outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
        finally:
            llm.shutdown()
            monkeypatch.undo()
        return [o["token_ids"] for o in outs]

    monkeypatch.setattr(Engine, "launch", counted)
    warm = run(warm=True)
    assert launched[0] == 300 and all(n < 300 for n in launched[1:])
    assert warm == run(warm=False)


def test_a_graph_less_engine_built_on_memory_another_left_behind(models_dir):
    """A later engine of a process is built on memory an earlier one freed. Its KV pool (most
    of the device) and page table are zero-filled on the default stream, which the engine's
    streams do not wait for, and without graphs there is no capture to wait in between: in
    chapter 21's ablation the warm-up prefill read old slots (an illegal address). Here the
    freed blocks of the page table's size are first filled with slots far past any pool; the
    second engine must still give the first one's tokens (the constructor waits, chapter 6)."""
    path = require_weights(models_dir / TINY_QWEN3)
    options = dict(dtype=torch.bfloat16, cuda_graph="off", max_running_req=4, page_size=16,
                   max_seq_len_override=128, device="cuda")  # the pool: 90% of what is free

    def run() -> tuple[list[list[int]], torch.Size]:
        llm = LLM(str(path), **options)
        try:
            shape = llm.backend.scheduler.engine.page_table.shape  # type: ignore[union-attr]
            outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
        finally:
            llm.shutdown()
        return [o["token_ids"] for o in outs], shape

    first, shape = run()
    junk = [torch.full(shape, 2**30, dtype=torch.int32, device="cuda") for _ in range(256)]
    del junk  # back to the allocator's cache, old contents and all
    second, _ = run()
    assert second == first
