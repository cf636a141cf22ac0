"""engine.sampler: top-k/top-p filtering against a per-row Python reference, greedy rows, the
empirical distribution of draws, seeded reproducibility; SamplingParams validation."""

from __future__ import annotations

import math

import pytest
import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Sampler, SamplingArgs, top_k_top_p_filter

CHAPTER = 6  # tools/steps.py check runs this module on chapter 6's own tree

CPU = torch.device("cpu")


def reference_kept(row: list[float], top_k: int, top_p: float) -> list[int]:
    """Indices a row keeps: sort descending, keep the top k, then the smallest prefix of the
    renormalised probabilities whose sum reaches top_p (the top-1 always stays)."""
    order = sorted(range(len(row)), key=lambda i: -row[i])[:top_k]
    top = max(row[i] for i in order)
    weights = [math.exp(row[i] - top) for i in order]
    total = sum(weights)
    kept, mass = [], 0.0
    for index, weight in zip(order, weights):
        if kept and mass >= top_p:
            break
        kept.append(index)
        mass += weight / total
    return kept


def reference_probs(logits: list[float], temperature: float, top_k: int,
                    top_p: float) -> list[float]:
    scaled = [x / temperature for x in logits]
    kept = reference_kept(scaled, top_k if top_k >= 1 else len(logits), top_p)
    top = max(scaled[i] for i in kept)
    weights = {i: math.exp(scaled[i] - top) for i in kept}
    total = sum(weights.values())
    return [weights.get(i, 0.0) / total for i in range(len(logits))]


def make_batch(params: list[SamplingParams]) -> Batch:
    reqs = [Req(torch.tensor([1, 2, 3], dtype=torch.int32), table_idx=i, cached_len=0,
                output_len=p.max_tokens, uid=i, sampling_params=p) for i, p in enumerate(params)]
    return Batch(reqs, "decode")


# --- top_k_top_p_filter --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_filter_matches_per_row_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab = 50
    top_k = torch.tensor([1, 3, 10, vocab, 7, vocab, 2, 25, vocab, 40])
    top_p = torch.tensor([1.0, 1.0, 0.5, 0.9, 0.3, 1.0, 0.95, 0.8, 0.05, 0.99])
    logits = torch.randn(len(top_k), vocab, generator=gen) * 2.0
    filtered = top_k_top_p_filter(logits, top_k, top_p)
    for r in range(len(top_k)):
        kept = sorted(reference_kept(logits[r].tolist(), int(top_k[r]), float(top_p[r])))
        assert torch.isfinite(filtered[r]).nonzero().flatten().tolist() == kept, r
        assert torch.equal(filtered[r, kept], logits[r, kept]), r


def test_filter_sets_dropped_logits_to_minus_infinity():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    filtered = top_k_top_p_filter(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert filtered.tolist() == [[float("-inf"), 3.0, float("-inf"), 2.0]]


def test_filter_always_keeps_top_1_even_for_tiny_top_p():
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3]])
    filtered = top_k_top_p_filter(logits, torch.tensor([4]), torch.tensor([1e-6]))
    assert torch.isfinite(filtered[0]).nonzero().flatten().tolist() == [3]


def test_filter_stops_at_the_prefix_that_exactly_reaches_top_p():
    # Four equal logits: probabilities 0.25 each, exactly; two tokens reach top_p = 0.5.
    filtered = top_k_top_p_filter(torch.zeros(1, 4), torch.tensor([4]), torch.tensor([0.5]))
    assert int(torch.isfinite(filtered).sum()) == 2


def test_filter_keeps_top_1_when_top_p_underflows_to_zero():
    # SamplingParams accepts top_p=1e-300; as float32 it is 0, which must not mask every token.
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3]])
    args = Sampler(CPU, 4, seed=0).prepare(
        make_batch([SamplingParams(temperature=1.0, top_p=1e-300)]))
    filtered = top_k_top_p_filter(logits, args.top_k, args.top_p)
    assert torch.isfinite(filtered[0]).nonzero().flatten().tolist() == [3]


def test_filter_without_limits_keeps_everything():
    logits = torch.randn(3, 20)
    filtered = top_k_top_p_filter(logits, torch.tensor([20, 20, 20]), torch.ones(3))
    assert torch.equal(filtered, logits)


# --- Sampler ---------------------------------------------------------------------------------------

def test_prepare_returns_none_for_all_greedy_batch():
    batch = make_batch([SamplingParams(), SamplingParams(temperature=0.9, top_k=1),
                        SamplingParams(temperature=0.0, top_k=5)])
    assert Sampler(CPU, 100, seed=0).prepare(batch) is None


def test_prepare_builds_per_request_tensors():
    batch = make_batch([SamplingParams(), SamplingParams(temperature=0.8, top_k=3, top_p=0.9),
                        SamplingParams(temperature=1.5)])
    args = Sampler(CPU, 100, seed=0).prepare(batch)
    assert args.temperatures.tolist() == pytest.approx([0.0, 0.8, 1.5])
    assert args.top_k.tolist() == [100, 3, 100]  # -1 (no top-k) becomes the vocabulary size
    assert args.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0])


def test_greedy_rows_return_argmax_in_a_mixed_batch():
    logits = torch.randn(6, 30)
    logits[[0, 2], :2] = torch.tensor([5.0, 5.0 - 1e-6])  # near-ties must not be sampled
    batch = make_batch([SamplingParams(), SamplingParams(temperature=1.0),
                        SamplingParams(temperature=0.0, top_p=0.5),
                        SamplingParams(temperature=2.0, top_k=10), SamplingParams(),
                        SamplingParams(temperature=0.7, top_k=1)])
    sampler = Sampler(CPU, 30, seed=0)
    args = sampler.prepare(batch)
    assert args is not None
    argmax = logits.argmax(-1)
    for _ in range(50):
        tokens = sampler.sample(logits, args)
        assert tokens[[0, 2, 4, 5]].tolist() == argmax[[0, 2, 4, 5]].tolist()


def test_a_request_greedy_by_top_k_1_returns_argmax_beside_unfiltered_sampling():
    """top_k=1 makes a request greedy whatever its temperature, also in a batch where no
    request filters (from chapter 17 the filter is then skipped, top_k=1 with it)."""
    logits = torch.randn(2, 30)
    batch = make_batch([SamplingParams(temperature=0.7, top_k=1), SamplingParams(temperature=1.0)])
    sampler = Sampler(CPU, 30, seed=0)
    args = sampler.prepare(batch)
    assert [sampler.sample(logits, args)[0].item() for _ in range(50)] == \
        [logits[0].argmax().item()] * 50


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (-1, 0.5), (1, 0.9)],
                         ids=["top_k-alone", "top_p-alone", "top_k-1-with-top_p"])
def test_prepared_requests_never_draw_outside_their_filter(top_k, top_p):
    """Through prepare: each limit alone filters, and top_k=1 keeps one token even where top_p
    would keep more."""
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(3))
    batch = make_batch([SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)] * 2000)
    sampler = Sampler(CPU, 40, seed=1)
    tokens = sampler.sample(logits.repeat(2000, 1), sampler.prepare(batch))
    kept = reference_kept(logits[0].tolist(), top_k if top_k >= 1 else 40, top_p)
    assert len(kept) < 40 and set(tokens.tolist()) <= set(kept)


@pytest.mark.parametrize("top_k", [101, 2**31 - 1, 2**63 - 1, 2**64])
def test_top_k_beyond_the_vocabulary_samples_as_the_whole_vocabulary(top_k):
    # 2**63 - 1 once became -2**63 on its way through float32: every token masked, NaN.
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0))
    draws = []
    for k in (top_k, -1):
        batch = make_batch([SamplingParams(temperature=1.0, top_k=k, top_p=0.9)] * 64)
        sampler = Sampler(CPU, 100, seed=5)
        args = sampler.prepare(batch)
        assert args.top_k.tolist() == [100] * 64
        draws.append(sampler.sample(logits, args))
    assert torch.equal(draws[0], draws[1])


def test_all_greedy_sample_is_argmax():
    logits = torch.randn(4, 30)
    assert torch.equal(Sampler(CPU, 30, seed=0).sample(logits, None), logits.argmax(-1))


def test_sampled_rows_never_leave_the_filtered_set():
    logits = torch.randn(1, 40).repeat(2000, 1)
    args = SamplingArgs(temperatures=torch.full((2000,), 1.0),
                        top_k=torch.full((2000,), 5), top_p=torch.full((2000,), 1.0))
    tokens = Sampler(CPU, 40, seed=1).sample(logits, args)
    assert set(tokens.tolist()) <= set(logits[0].topk(5).indices.tolist())


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 3, 0.9), (0.5, -1, 1.0),
                                                       (2.0, 4, 0.8)])
def test_empirical_distribution_matches_filtered_softmax(temperature, top_k, top_p):
    logits = [3.0, 2.0, 1.0, 0.5, 0.0, -1.0]
    draws = 20_000
    batch = make_batch([SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)])
    sampler = Sampler(CPU, len(logits), seed=1234)
    one = sampler.prepare(batch)
    # One request's arguments, for `draws` rows (from chapter 17, no filter is None).
    args = SamplingArgs(*(None if t is None else t.repeat(draws)
                          for t in (one.temperatures, one.top_k, one.top_p)))
    tokens = sampler.sample(torch.tensor([logits]).repeat(draws, 1), args)
    freq = torch.bincount(tokens, minlength=len(logits)).double() / draws
    expected = torch.tensor(reference_probs(logits, temperature, top_k, top_p), dtype=torch.double)
    assert torch.equal(freq == 0, expected == 0)  # filtered tokens are never drawn
    assert (freq - expected).abs().max() < 0.015


def test_same_seed_reproduces_the_same_draws():
    logits = torch.randn(500, 20)
    args = SamplingArgs(torch.full((500,), 1.0), torch.full((500,), 20), torch.full((500,), 1.0))
    first = Sampler(CPU, 20, seed=7).sample(logits, args)
    second = Sampler(CPU, 20, seed=7).sample(logits, args)
    assert torch.equal(first, second)


def test_different_seeds_give_different_draws():
    logits = torch.zeros(500, 20)
    args = SamplingArgs(torch.full((500,), 1.0), torch.full((500,), 20), torch.full((500,), 1.0))
    assert not torch.equal(Sampler(CPU, 20, seed=7).sample(logits, args),
                           Sampler(CPU, 20, seed=8).sample(logits, args))


# --- SamplingParams validation -------------------------------------------------------------------

@pytest.mark.parametrize("field, value, shown", [
    ("temperature", -0.1, "-0.1"),
    ("temperature", float("nan"), "nan"),
    ("top_k", 0, "0"),
    ("top_k", -2, "-2"),
    ("top_p", 0.0, "0.0"),
    ("top_p", 1.5, "1.5"),
    ("max_tokens", 0, "0"),
])
def test_sampling_params_out_of_range_raise_naming_the_value(field, value, shown):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert field in message and message.endswith(f"got {shown}")


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(top_k=-1), dict(top_k=1),
                                    dict(top_p=1.0), dict(top_p=1e-3), dict(max_tokens=1)])
def test_sampling_params_boundary_values_are_accepted(kwargs):
    params = SamplingParams(**kwargs)
    assert all(getattr(params, k) == v for k, v in kwargs.items())
