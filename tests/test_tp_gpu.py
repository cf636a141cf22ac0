"""Chapter 16 on CUDA: the NCCL path of the communicator, at world size 1 on one GPU, and TP=2
(the offline engine and the server) when two GPUs are visible. Skips without CUDA."""

import sys

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.distributed import (TorchDistributed, TPInfo, destroy_distributed, get_comm,
                                 init_distributed)
from minisgl.llm import LLM
from gpu_helpers import require_weights
from minisgl.utils.process import rendezvous_address
from minisgl.utils.zmq_queue import new_run_id
from processes import Child

CHAPTER = 16  # tools/steps.py check runs this module on chapter 16's own tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):"]
ARGS = dict(max_running_req=4, num_page_override=512, max_seq_len_override=256)


def _tokens(llm: LLM) -> list[list[int]]:
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def test_nccl_collectives_at_world_size_one():
    device = torch.device("cuda", 0)
    comm = init_distributed(TPInfo(0, 1), device, rendezvous_address(new_run_id()))
    try:
        assert isinstance(comm, TorchDistributed) and get_comm() is comm
        assert torch.distributed.get_backend() == "nccl"
        x = torch.randn(4, 6, device=device)
        assert torch.equal(comm.all_reduce(x.clone()), x)
        assert torch.equal(comm.all_gather(x), x)
        assert comm.min_over_ranks(7) == 7
    finally:
        destroy_distributed()
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("model", ["tiny_qwen3_path", "smollm2_path"])
def test_nccl_world_size_one_generates_the_same_tokens(model, request):
    path = str(require_weights(request.getfixturevalue(model)))
    plain = _tokens(LLM(path, device="cuda", **ARGS))
    nccl = _tokens(LLM(path, device="cuda", dist_init_address=rendezvous_address(new_run_id()),
                       **ARGS))
    assert nccl == plain


two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2 if torch.cuda.is_available() else True, reason="needs 2 GPUs")


@two_gpus
def test_tp2_on_two_gpus_equals_tp1(tiny_qwen3_path):
    one = _tokens(LLM(str(tiny_qwen3_path), device="cuda", **ARGS))
    two = _tokens(LLM(str(tiny_qwen3_path), device="cuda", tp_size=2, **ARGS))
    assert two == one


@two_gpus
def test_server_with_tp2_on_two_gpus_answers_as_tp1(tiny_qwen3_path):
    """`python -m minisgl --tp 2`: one scheduler process per GPU behind the HTTP server; its
    greedy completions (float32) equal the offline engine's at TP=1."""
    import httpx

    llm = LLM(str(tiny_qwen3_path), device="cuda", **ARGS)
    try:
        expected = [o["text"] for o in llm.generate(
            PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))]
    finally:
        llm.shutdown()
    server = Child([sys.executable, "-m", "minisgl", "--model", str(tiny_qwen3_path),
                    "--tp", "2", "--device", "cuda", "--dtype", "float32", "--port", "0",
                    "--max-running-req", "4", "--num-pages", "512", "--max-seq-len", "256"])
    try:
        with httpx.Client(base_url=server.served_url(), timeout=120) as http:
            for prompt, text in zip(PROMPTS, expected):
                r = http.post("/v1/completions", json={
                    "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] == text, prompt
    finally:
        assert server.stop() == 0, server.output
