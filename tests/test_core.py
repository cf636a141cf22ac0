"""core: Req's derived lengths, Batch, the global Context and SamplingParams."""

from __future__ import annotations

import pytest
import torch

import minisgl.core.context as context_module
from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, set_global_ctx

CHAPTER = 1  # tools/steps.py check runs this module on chapter 1's own tree


def make_req(prompt: list[int], cached_len: int = 0, output_len: int = 3) -> Req:
    return Req(torch.tensor(prompt, dtype=torch.int32), table_idx=0, cached_len=cached_len,
               output_len=output_len, uid=0, sampling_params=SamplingParams(max_tokens=3))


class _Backend:
    def forward(self, q, k, v, layer_id, batch):  # pragma: no cover - never called here
        raise AssertionError


# --- Req ---------------------------------------------------------------------------------------

def test_new_req_extends_its_whole_uncached_prompt():
    req = make_req([5, 6, 7, 8, 9], cached_len=2, output_len=3)
    assert (req.device_len, req.extend_len, req.max_device_len) == (5, 3, 8)


def test_new_req_may_still_generate_output_len_tokens():
    req = make_req([5, 6, 7, 8, 9], output_len=3)
    assert req.remain_len == 3 and req.can_decode


def test_complete_one_caches_everything_and_schedules_one_token():
    req = make_req([5, 6, 7, 8, 9], output_len=3)
    req.complete_one()
    assert (req.cached_len, req.device_len, req.extend_len, req.remain_len) == (5, 6, 1, 2)


def test_req_stops_decoding_after_output_len_tokens():
    req = make_req([5, 6, 7], output_len=3)
    can_decode = []
    for token in (11, 12, 13):
        req.complete_one()
        req.append_host(token)
        can_decode.append(req.can_decode)
    assert can_decode == [True, True, False] and req.remain_len == 0


def test_append_host_grows_input_ids_as_int32():
    req = make_req([5, 6, 7])
    req.complete_one()
    req.append_host(42)
    assert req.input_ids.dtype == torch.int32 and req.input_ids.tolist() == [5, 6, 7, 42]


def test_output_ids_are_the_tokens_after_the_prompt():
    req = make_req([5, 6, 7], output_len=3)
    assert req.output_ids == []
    for token in (11, 12):
        req.complete_one()
        req.append_host(token)
    assert req.output_ids == [11, 12]


def test_output_ids_exclude_a_cached_prompt_prefix_too():
    req = make_req([5, 6, 7, 8], cached_len=3, output_len=2)
    req.complete_one()
    req.append_host(99)
    assert req.output_ids == [99]


@pytest.mark.parametrize("cached_len", [-1, 4, 5])
def test_cached_len_outside_prompt_raises(cached_len):
    with pytest.raises(ValueError, match=str(cached_len)):
        make_req([1, 2, 3, 4], cached_len=cached_len)


def test_req_rejects_non_cpu_input_ids():
    with pytest.raises(ValueError, match="CPU"):
        Req(torch.empty(3, dtype=torch.int32, device="meta"), table_idx=0, cached_len=0,
            output_len=1, uid=0, sampling_params=SamplingParams())


# --- Batch -------------------------------------------------------------------------------------

def test_batch_phase_and_size():
    reqs = [make_req([1, 2]), make_req([3])]
    prefill, decode = Batch(reqs, "prefill"), Batch(reqs, "decode")
    assert (prefill.is_prefill, prefill.is_decode, prefill.size) == (True, False, 2)
    assert (decode.is_prefill, decode.is_decode) == (False, True)


# --- Context -----------------------------------------------------------------------------------

def test_context_batch_outside_forward_batch_raises():
    ctx = Context(attn_backend=_Backend())
    with pytest.raises(RuntimeError, match="forward_batch"):
        _ = ctx.batch


def test_context_batch_is_the_forwarded_batch_inside_forward_batch():
    ctx, batch = Context(attn_backend=_Backend()), Batch([make_req([1])], "prefill")
    with ctx.forward_batch(batch):
        assert ctx.batch is batch
    with pytest.raises(RuntimeError):
        _ = ctx.batch


def test_nested_forward_batch_raises_and_keeps_the_outer_batch():
    ctx = Context(attn_backend=_Backend())
    outer, inner = Batch([make_req([1])], "prefill"), Batch([make_req([2])], "prefill")
    with ctx.forward_batch(outer):
        with pytest.raises(RuntimeError, match="nest"):
            with ctx.forward_batch(inner):
                pass
        assert ctx.batch is outer


def test_forward_batch_clears_the_batch_after_an_exception():
    ctx = Context(attn_backend=_Backend())
    with pytest.raises(ZeroDivisionError):
        with ctx.forward_batch(Batch([make_req([1])], "prefill")):
            1 / 0
    with pytest.raises(RuntimeError):
        _ = ctx.batch
    with ctx.forward_batch(Batch([make_req([2])], "decode")):  # usable again
        assert ctx.batch.is_decode


def test_get_global_ctx_without_one_raises(monkeypatch):
    monkeypatch.setattr(context_module, "_GLOBAL_CTX", None)
    with pytest.raises(RuntimeError, match="set_global_ctx"):
        get_global_ctx()


def test_set_global_ctx_installs_the_context(monkeypatch):
    monkeypatch.setattr(context_module, "_GLOBAL_CTX", None)
    ctx = Context(attn_backend=_Backend())
    set_global_ctx(ctx)
    assert get_global_ctx() is ctx


# --- SamplingParams.is_greedy ------------------------------------------------------------------

@pytest.mark.parametrize("params, greedy", [
    (SamplingParams(), True),
    (SamplingParams(temperature=0.7), False),
    (SamplingParams(temperature=0.7, top_k=1), True),
    (SamplingParams(temperature=0.0, top_p=0.9), False),
])
def test_sampling_params_is_greedy(params, greedy):
    assert params.is_greedy is greedy


# --- the chapter's example ---

import re  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_walks_a_req_and_shows_the_promised_errors():
    out = run_example("ch01_core.py")
    prompt_len, output_len = 5, 3  # its request: 5 prompt tokens, output_len=3
    rows = [tuple(map(int, r)) for r in re.findall(
        r"cached_len=(\d+), device_len=(\d+), max_device_len=(\d+)\) extend_len=(\d+)", out)]
    # Before any forward everything is to compute; after step k the cached part is all but the
    # token sampled last, which is the single token of the next step.
    total = prompt_len + output_len
    assert rows == [(0, prompt_len, total, prompt_len)] + [
        (prompt_len + k - 1, prompt_len + k, total, 1) for k in range(1, output_len + 1)]
    assert f"remain_len={output_len}" in out
    assert re.findall(r"can_decode=(\w+)", out) == ["True"] * (output_len - 1) + ["False"]
    assert "输出 token: [7042, 30, 198]" in out  # the three tokens it appends, in order
    # Each rejected value is named in its message ("top_p must be in (0, 1], got 0" in the book).
    for field, value in [("temperature", -1.0), ("top_p", 0.0), ("top_k", 0), ("max_tokens", 0)]:
        assert re.search(rf"ValueError: {field} must be .*, got {re.escape(str(value))}$", out,
                         re.M), field
    assert "ctx.batch 就是 decode batch" in out
    assert re.search(r"^嵌套 forward_batch → RuntimeError: .*nest", out, re.M)
    assert re.search(r"^forward_batch 之外读 ctx.batch → RuntimeError: .*"
                     r"with ctx\.forward_batch\(batch\):", out, re.M)
