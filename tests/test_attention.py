"""attention: the torch backend over the paged pool against dense causal attention computed per
request from its full K/V, on random ragged batches, several page sizes, shuffled pages, cached
prefixes, decode and GQA; then whole models' prefill logits with this backend against transformers."""

from __future__ import annotations

import pytest
import torch

from minisgl.attention import ATTENTION_BACKENDS, TorchAttentionBackend
from conftest import SMOLLM2, TINY_LLAMA, TINY_MISTRAL, TINY_QWEN2, TINY_QWEN3
from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.kvcache import MHAKVPool
from minisgl.models import CausalLM

from attention_helpers import HEAD_DIM, KV_HEADS, LAYER, Setup, dense_causal_reference

CHAPTER = 5  # tools/steps.py check runs this module on chapter 5's own tree

SEEDS = [0, 1, 2]
PAGE_SIZES = [1, 4, 16]
GROUPS = [1, 2, 4]  # query heads per KV head: MHA, and GQA 2x / 4x


def every_shape(test):
    """Parametrize `test` over every seed, page size and number of query heads per KV head."""
    for name, values in [("seed", SEEDS), ("page_size", PAGE_SIZES), ("q_per_kv", GROUPS)]:
        test = pytest.mark.parametrize(name, values)(test)
    return test


@every_shape
def test_ragged_prefill_matches_dense_causal_attention(seed, page_size, q_per_kv):
    setup = Setup(seed, page_size, q_per_kv)
    spans = [(s, 0, s.length) for s in setup.seqs]
    out, _ = setup.forward(spans)
    torch.testing.assert_close(out, dense_causal_reference(spans), atol=1e-5, rtol=1e-5)


@every_shape
def test_prefill_over_cached_prefix_matches_dense_causal_attention(seed, page_size, q_per_kv):
    setup = Setup(seed, page_size, q_per_kv, min_len=2)
    # Each request has a cached prefix of random length; some may have none (cached_len 0).
    cached = [setup.randint(0, s.length - 1) for s in setup.seqs]
    cached[0] = max(cached[0], 1)
    setup.forward([(s, 0, c) for s, c in zip(setup.seqs, cached) if c > 0])  # store prefixes
    spans = [(s, c, s.length) for s, c in zip(setup.seqs, cached)]
    out, _ = setup.forward(spans)
    torch.testing.assert_close(out, dense_causal_reference(spans), atol=1e-5, rtol=1e-5)


@every_shape
def test_decode_matches_dense_causal_attention(seed, page_size, q_per_kv):
    setup = Setup(seed, page_size, q_per_kv, min_len=2)
    setup.forward([(s, 0, s.length - 1) for s in setup.seqs])
    spans = [(s, s.length - 1, s.length) for s in setup.seqs]
    out, batch = setup.forward(spans, "decode")
    assert out.shape == (len(spans), KV_HEADS * q_per_kv, HEAD_DIM)
    torch.testing.assert_close(out, dense_causal_reference(spans), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_several_decode_steps_match_dense_causal_attention(seed):
    setup = Setup(seed, page_size=4, q_per_kv=2, min_len=4)
    setup.forward([(s, 0, s.length - 3) for s in setup.seqs])
    for back in (3, 2, 1):
        spans = [(s, s.length - back, s.length - back + 1) for s in setup.seqs]
        out, _ = setup.forward(spans, "decode")
        torch.testing.assert_close(out, dense_causal_reference(spans), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_last_indices_are_each_requests_last_row(seed):
    setup = Setup(seed, page_size=4, q_per_kv=2, min_len=2)
    cached = [setup.randint(0, s.length - 1) for s in setup.seqs]
    cached[-1] = max(cached[-1], 1)
    setup.forward([(s, 0, c) for s, c in zip(setup.seqs, cached) if c > 0])
    _, batch = setup.forward([(s, c, s.length) for s, c in zip(setup.seqs, cached)])
    extend = [s.length - c for s, c in zip(setup.seqs, cached)]
    expected = [sum(extend[: i + 1]) - 1 for i in range(len(extend))]
    assert batch.attn_metadata.last_indices.tolist() == expected


def test_decode_last_indices_are_one_per_request():
    setup = Setup(5, page_size=1, q_per_kv=2, min_len=2)
    setup.forward([(s, 0, s.length - 1) for s in setup.seqs])
    _, batch = setup.forward([(s, s.length - 1, s.length) for s in setup.seqs], "decode")
    assert batch.attn_metadata.last_indices.tolist() == list(range(len(setup.seqs)))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_forward_stores_new_kv_at_out_loc(page_size):
    setup = Setup(3, page_size, q_per_kv=2)
    spans = [(s, 0, s.length) for s in setup.seqs]
    _, batch = setup.forward(spans)
    k = torch.cat([s.k for s in setup.seqs])
    v = torch.cat([s.v for s in setup.seqs])
    assert torch.equal(setup.pool.k_cache(LAYER)[batch.out_loc], k)
    assert torch.equal(setup.pool.v_cache(LAYER)[batch.out_loc], v)
    assert setup.pool.k_cache(0).abs().sum() == 0  # the other layer is untouched


def test_torch_backend_is_registered_by_name():
    assert ATTENTION_BACKENDS.get("torch") is TorchAttentionBackend


def test_unknown_backend_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="'flash'.*torch"):
        ATTENTION_BACKENDS.get("flash")


# --- logits against transformers -----------------------------------------------------------------

def forward_logits(model: CausalLM, prompts: list[list[int]], page_size: int = 4) -> torch.Tensor:
    """Prefill `prompts` as one batch with the torch backend over a small pool; pages handed out
    in order, page table filled by hand. Returns one row of logits per prompt."""
    c = model.config
    total_pages = sum(-(-len(p) // page_size) for p in prompts)
    pool = MHAKVPool(c.num_layers, total_pages, page_size, c.num_kv_heads, c.head_dim,
                     torch.float32, "cpu")
    max_len = max(len(p) for p in prompts)
    page_table = torch.zeros(len(prompts), max_len, dtype=torch.int32)
    next_page = 0
    for row, prompt in enumerate(prompts):
        for pos in range(len(prompt)):
            if pos % page_size == 0:
                page, next_page = next_page, next_page + 1
            page_table[row, pos] = page * page_size + pos % page_size
    backend = TorchAttentionBackend(pool, page_table)
    ctx = Context(attn_backend=backend)
    set_global_ctx(ctx)
    reqs = [Req(torch.tensor(p, dtype=torch.int32), table_idx=i, cached_len=0, output_len=1,
                uid=i, sampling_params=SamplingParams(max_tokens=1))
            for i, p in enumerate(prompts)]
    batch = Batch(reqs, "prefill")
    batch.input_ids = torch.cat([r.input_ids for r in reqs]).long()
    batch.positions = torch.cat([torch.arange(len(p)) for p in prompts])
    batch.out_loc = torch.cat([page_table[i, :len(p)] for i, p in enumerate(prompts)]).long()
    backend.prepare_metadata(batch)
    with ctx.forward_batch(batch):
        return model.forward()


PROMPTS = [[1, 504, 3458, 282, 4649, 314], [9, 8, 7, 6, 5, 4, 3, 2, 1000, 2000, 3000],
           [17, 42, 42, 17, 3]]


@pytest.mark.parametrize("name", [SMOLLM2, TINY_QWEN3, TINY_LLAMA, TINY_QWEN2, TINY_MISTRAL])
def test_last_token_logits_match_hf(name, hf_model, our_model):
    prompt = PROMPTS[0]
    ours = forward_logits(our_model(name), [prompt])
    theirs = hf_model(name)(torch.tensor([prompt])).logits[:, -1]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", [TINY_QWEN3, TINY_LLAMA, TINY_QWEN2, TINY_MISTRAL])
def test_ragged_batch_logits_match_hf_per_prompt(name, hf_model, our_model):
    ours = forward_logits(our_model(name), PROMPTS)
    hf = hf_model(name)
    theirs = torch.cat([hf(torch.tensor([p])).logits[:, -1] for p in PROMPTS])
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


# --- the chapter's example ---

import re  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_batches_three_lengths_like_dense_causal_attention():
    out = run_example("ch05_attention.py")
    lengths = [3, 9, 5]  # its three requests, packed one after another in the batch
    last = [sum(lengths[: i + 1]) - 1 for i in range(len(lengths))]
    assert f"每个请求最后一个 token 在 batch 中的下标： {last}" in out
    # Each request's slice against torch's own dense causal SDPA (enable_gqa) on the same q/k/v.
    errors = re.findall(r"^长度 (\d+) 的请求：与稠密因果 SDPA 的最大误差 (\S+)$", out, re.M)
    assert [int(n) for n, _ in errors] == lengths
    assert all(float(e) < 1e-5 for _, e in errors), errors
