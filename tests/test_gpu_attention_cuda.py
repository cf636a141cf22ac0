"""The real FlashInfer and FA3 kernels on a GPU (skipped without CUDA or without flashinfer):
each backend against the torch backend on the same random batches in bfloat16, no host
synchronisation inside a step, and the same greedy tokens as the torch backend."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import SMOLLM2
from gpu_helpers import (PROMPTS, assert_same_up_to_near_ties, backends, gpu_model,
                         require_weights)
from minisgl.attention import TorchAttentionBackend, create_attention_backend
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.utils import use_stream
from test_gpu_attention import SHAPES, random_batch

CHAPTER = 17

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                       reason="needs flashinfer-python (pip install -e '.[gpu]')"),
]


# bfloat16 keeps 8 significant bits: rounding the output alone moves it by up to 2**-9 of its
# size, and the kernels round the attention probabilities to bfloat16 before multiplying them
# with V. Outputs here are averages of N(0, 1) values. On the H200 the largest error against
# float32 over all cases was 1.66e-2, for the kernels and for the torch backend in bfloat16
# alike (book/runs/gpu_pytest.h200.txt): 2e-2 is that precision's own error level, while
# a wrong mask, page or scale gives errors of order 1.
TOLERANCE = 2e-2


@pytest.mark.parametrize("phase", ["prefill", "prefix", "decode"])
@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}q{s[1]}kv{s[2]}")
@pytest.mark.parametrize("name", ["flashinfer", "fa"])
def test_kernels_match_float32_reference(name, shape, page_size, phase):
    if name not in backends():
        pytest.skip("FA3 kernels need a Hopper GPU")
    q_heads, kv_heads, head_dim = shape
    worst = {"kernel": 0.0, "torch bf16": 0.0}
    for seed in range(3):
        # The same batch three times: float32 torch backend (the reference), bfloat16 torch
        # backend, bfloat16 kernel.
        outputs = {}
        for label, dtype, backend_name in [("ref", torch.float32, "torch"),
                                           ("torch bf16", torch.bfloat16, "torch"),
                                           ("kernel", torch.bfloat16, name)]:
            pool, table, batch, gen = random_batch(seed, page_size, kv_heads, head_dim, phase,
                                                   dtype, "cuda")
            q = torch.randn(len(batch.out_loc), q_heads, head_dim, generator=gen).to("cuda", dtype)
            batch.out_loc = batch.out_loc.cuda()
            k, v = pool.k_cache(1)[batch.out_loc].clone(), pool.v_cache(1)[batch.out_loc].clone()
            backend = (TorchAttentionBackend(pool, table) if backend_name == "torch"
                       else create_attention_backend(name, pool, table, q_heads))
            backend.prepare_metadata(batch)
            outputs[label] = backend.forward(q, k, v, 1, batch).float()
        for label in worst:
            worst[label] = max(worst[label],
                               (outputs[label] - outputs["ref"]).abs().max().item())
    print(f"\n{name} {shape} page_size={page_size} {phase}: max |error| against float32 — "
          f"kernel {worst['kernel']:.2e}, torch bf16 {worst['torch bf16']:.2e}")
    assert worst["kernel"] <= TOLERANCE


def generate(path, attn: str, page_size: int) -> list[list[int]]:
    llm = LLM(str(path), dtype=torch.bfloat16, attention_backend=attn, page_size=page_size,
              max_running_req=8, max_seq_len_override=512, num_page_override=4096,
              device="cuda")
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


@pytest.mark.parametrize("page_size", [1, 16])
def test_same_greedy_tokens_as_torch_backend(models_dir, page_size):
    """SmolLM2 in bfloat16: each backend's greedy tokens equal the torch backend's, up to near
    ties (gpu_helpers.assert_same_up_to_near_ties)."""
    path = require_weights(models_dir / SMOLLM2)
    expected = generate(path, "torch", page_size)
    for name in backends():
        assert_same_up_to_near_ties(path, PROMPTS, expected, generate(path, name, page_size),
                                    f"{name} page_size={page_size}")


@pytest.mark.parametrize("name", ["flashinfer", "fa"])
def test_no_host_sync_inside_a_step(models_dir, name):
    """A step (schedule, allocate, metadata and plan, launch) must not make the host wait for
    the device, or overlap scheduling would hide nothing: CUDA's sync debug mode turns any
    synchronising call into an error."""
    if name not in backends():
        pytest.skip("FA3 kernels need a Hopper GPU")
    # Without overlap each step reads its own tokens, so the steps below can be taken apart.
    llm = LLM(str(gpu_model(models_dir)), dtype=torch.bfloat16, attention_backend=name,
              page_size=16, max_running_req=8, max_seq_len_override=512, num_page_override=256,
              device="cuda", overlap=False)
    try:
        scheduler = llm.backend.scheduler  # type: ignore[union-attr]
        for uid in range(4):
            scheduler.add_request(uid, torch.arange(20 + 7 * uid, dtype=torch.int32) + 100,
                                  SamplingParams(max_tokens=40, ignore_eos=True))
        for _ in range(6):  # prefill and a few decode steps, normally
            scheduler.step()
        torch.cuda.synchronize()
        for _ in range(3):
            torch.cuda.set_sync_debug_mode("error")
            try:
                in_flight = launch_one_batch(scheduler)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            scheduler._process(in_flight, [])
    finally:
        llm.shutdown()


def launch_one_batch(scheduler):
    """Schedule and launch one decode batch without reading its tokens. Chapter 17's scheduler
    prepares the batch itself on its own stream; from chapter 18 the engine does, on its
    preparation stream."""
    if hasattr(scheduler, "_prepare"):  # chapter 17
        with use_stream(scheduler.stream):
            batch = scheduler._schedule()
            assert batch is not None and batch.is_decode
            return scheduler._launch(batch, scheduler._prepare(batch))
    with use_stream(scheduler.engine.prepare_stream):
        batch = scheduler._schedule()
        assert batch is not None and batch.is_decode
        return scheduler._launch(batch)
