"""scheduler.Scheduler end to end on the tiny random models: randomized workloads (arrival
order and steps, prompt lengths, shared prefixes, page sizes, small pools, chunked prefill,
radix and naive caches, overlap on and off) give each request exactly what it gives alone, leak
no page or row, and keep the cache's bookkeeping consistent after every step; plus EOS handling,
request rejection and the interleaving of chunked prefill with decode."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from conftest import MODELS_DIR, TINY_LLAMA, TINY_QWEN3
from minisgl.core import Req, SamplingParams, set_global_ctx
from minisgl.scheduler import Scheduler, SchedulerConfig, TokenOutput
from minisgl.scheduler.cache import pages_for
from minisgl.scheduler.prefill import ChunkedReq

CHAPTER = 7  # tools/steps.py check runs this module on chapter 7's own tree

VOCAB = 49152  # both tiny models
REF_TOKENS = 20  # references are computed once per prompt for this many tokens (greedy: a
# request with max_tokens=m gives the first m of them)


def make_scheduler(model: str, **overrides) -> Scheduler:
    options = dict(max_running_req=4, page_size=1, num_page_override=256,
                   max_seq_len_override=None, cache_type="radix", overlap=False)
    options.update(overrides)
    return Scheduler(SchedulerConfig(str(MODELS_DIR / model), dtype=torch.float32, **options))


def greedy(max_tokens: int, ignore_eos: bool = True) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)


@dataclass
class Arrival:
    step: int
    uid: int
    ids: list[int]
    max_tokens: int


def held_requests(s: Scheduler) -> list[Req]:
    """Every request that holds pages outside the prefix cache right now: the running ones,
    those done but still inside the batch in flight (overlap), every request of that batch (one
    that reached max_tokens there is in neither set yet), and the chunk of a prompt whose
    prefill is not complete."""
    held: dict[Req, None] = dict.fromkeys(s.decode.running)
    held.update(dict.fromkeys(s.finished))
    if s.in_flight is not None:
        held.update(dict.fromkeys(s.in_flight.batch.reqs))
    held.update(dict.fromkeys(p.chunk for p in s.prefill.pending if p.chunk is not None))
    return list(held)


def drive(s: Scheduler, arrivals: list[Arrival], check_every_step: bool = True,
          ignore_eos: bool = True, stats: Counter | None = None) -> dict[int, list[TokenOutput]]:
    """Add each request at its arrival step and step until everything has finished; returns
    each uid's TokenOutputs in order. With check_every_step, the cache manager's integrity
    check runs after every step. `stats["waited"]` counts the steps after which an arrived
    request was still waiting for admission."""
    stats = Counter() if stats is None else stats
    set_global_ctx(s.engine.ctx)  # the engine created last owns the Context: take it back
    outputs: dict[int, list[TokenOutput]] = {a.uid: [] for a in arrivals}
    waiting = sorted(arrivals, key=lambda a: a.step)  # stable: same-step order is kept
    step = 0
    while waiting or s.has_work:
        while waiting and waiting[0].step <= step:
            a = waiting.pop(0)
            s.add_request(a.uid, a.ids, greedy(a.max_tokens, ignore_eos))
        for out in s.step():
            outputs[out.uid].append(out)
        stats["waited"] += any(p.chunk is None for p in s.prefill.pending)
        if check_every_step:
            s.cache.check_integrity(held_requests(s))
        step += 1
        assert step < 10_000, "the scheduler does not make progress"
    return outputs


_REFERENCES: dict[tuple[str, tuple[int, ...]], list[int]] = {}


def reference(model: str, ids: list[int]) -> list[int]:
    """The first REF_TOKENS greedy tokens of this prompt run alone (fresh scheduler, one
    request, no chunking, no overlap), computed once per (model, prompt)."""
    key = (model, tuple(ids))
    if key not in _REFERENCES:
        s = make_scheduler(model, max_running_req=1, page_size=1,
                           num_page_override=len(ids) + REF_TOKENS, overlap=False)
        out = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], check_every_step=False)
        _REFERENCES[key] = [o.token for o in out[0]]
    return _REFERENCES[key]


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]  # no BOS/EOS ids


@dataclass
class Workload:
    model: str
    config: dict
    arrivals: list[Arrival]


def random_workload(seed: int) -> Workload:
    """A small random workload whose pool barely fits its largest request. Page size, overlap,
    cache type and model cycle with the seed (every page size runs with overlap on and off, the
    naive cache with four page sizes, both models with most page sizes); the rest is drawn."""
    rng = random.Random(seed)
    page_size = [1, 2, 4, 16][seed % 4]
    overlap = (seed // 4) % 2 == 0
    cache_type = "naive" if seed % 3 == 2 else "radix"
    model = [TINY_QWEN3, TINY_LLAMA][(seed // 6) % 2]
    prompts: list[list[int]] = []
    arrivals = []
    uids = rng.sample(range(100), rng.randint(5, 9))  # random uids: arrival order != uid order
    for uid in uids:
        if prompts and rng.random() < 0.5:  # reuse a prefix of an earlier prompt
            base = rng.choice(prompts)
            keep = rng.randint(1, len(base))
            ids = base[:keep] + random_ids(rng, rng.randint(0, 60 - keep))
        else:
            ids = random_ids(rng, rng.randint(1, 60))
        prompts.append(ids)
        arrivals.append(Arrival(rng.randint(0, 12), uid, ids, rng.randint(1, 20)))
    # check_request_fits wants prompt + max_tokens <= pool slots; admission wants
    # pages_for(prompt + max_tokens - 1). Take the stricter one, plus at most one page.
    largest = max(pages_for(len(a.ids) + a.max_tokens, page_size) for a in arrivals)
    config = dict(page_size=page_size, overlap=overlap, cache_type=cache_type,
                  max_running_req=rng.randint(1, 6),
                  num_page_override=largest + rng.randint(0, 1),
                  max_prefill_length=rng.choice([rng.randint(1, 8), rng.randint(1, 8),
                                                 rng.randint(9, 64), 8192]))
    return Workload(model, config, arrivals)


SEEDS = list(range(12))


@dataclass
class Run:
    workload: Workload
    scheduler: Scheduler
    outputs: dict[int, list[TokenOutput]]
    stats: Counter


_RUNS: dict[int, Run | Exception] = {}


def run_seed(seed: int) -> Run:
    """Each seed's workload is run once and shared by the per-seed tests below (references
    first, each on its own scheduler). A run that raised raises again in every test of its
    seed, and only there."""
    if seed not in _RUNS:
        try:
            w = random_workload(seed)
            for a in w.arrivals:
                reference(w.model, a.ids)
            s, stats = make_scheduler(w.model, **w.config), Counter()
            _RUNS[seed] = Run(w, s, drive(s, w.arrivals, stats=stats), stats)
        except Exception as error:  # noqa: BLE001 - re-raised below, per test
            _RUNS[seed] = error
    result = _RUNS[seed]
    if isinstance(result, Exception):
        raise result
    return result


# --- randomized runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_random_run_finishes_every_request_once_with_max_tokens(seed):
    run = run_seed(seed)
    for a in run.workload.arrivals:
        flags = [o.finished for o in run.outputs[a.uid]]
        assert len(flags) == a.max_tokens, a.uid
        assert flags.count(True) == 1 and flags[-1], a.uid


@pytest.mark.parametrize("seed", SEEDS)
def test_random_run_equals_each_request_run_alone(seed):
    run = run_seed(seed)
    w = run.workload
    for a in w.arrivals:
        got = [o.token for o in run.outputs[a.uid]]
        assert got == reference(w.model, a.ids)[: a.max_tokens], (a.uid, w.config)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_run_leaks_no_page_and_no_row(seed):
    run = run_seed(seed)
    s, config = run.scheduler, run.workload.config
    cache, ps = s.cache, s.engine.page_size
    assert not s.has_work and s.in_flight is None and not s.finished
    assert cache.handles == {}
    assert cache.prefix_cache.protected_size == 0
    assert len(set(cache.free_pages)) == len(cache.free_pages)
    if config["cache_type"] == "radix":
        assert len(cache.free_pages) + cache.prefix_cache.evictable_size // ps == s.engine.num_pages
    else:
        assert len(cache.free_pages) == s.engine.num_pages
    assert s.table.available == config["max_running_req"]
    assert sorted(s.table.free_rows) == list(range(config["max_running_req"]))


def test_random_workloads_cover_waiting_chunking_hits_and_eviction():
    """The seeds above really exercise what they are meant to: among the runs that completed,
    some queued requests behind a full pool, chunked a prompt, hit the radix cache (with
    overlap on and off) and evicted from it."""
    done: dict[int, Run] = {}
    for seed in SEEDS:
        try:
            done[seed] = run_seed(seed)
        except Exception:  # noqa: BLE001 - reported by that seed's own tests
            pass
    assert len(done) >= len(SEEDS) // 2
    waited = [seed for seed, run in done.items() if run.stats["waited"] > 0]
    chunked = [seed for seed, run in done.items() if run.workload.config["max_prefill_length"]
               < max(len(a.ids) for a in run.workload.arrivals)]
    hits = [seed for seed, run in done.items() if run.scheduler.cache.hit_tokens > 0]
    evictions = [seed for seed, run in done.items() if run.scheduler.cache.evicted_pages > 0]
    assert waited and chunked and hits and evictions
    assert {done[seed].workload.config["overlap"] for seed in hits} == {True, False}


# --- overlap --------------------------------------------------------------------------------------

def shared_prefix_workload(seed: int, n: int = 6) -> list[Arrival]:
    rng = random.Random(seed)
    base = random_ids(rng, 40)
    return [Arrival(rng.randint(0, 6), uid, base[: rng.randint(8, 40)] + random_ids(rng, 5),
                    rng.randint(1, 20)) for uid in range(n)]


def test_overlap_on_and_off_give_identical_outputs(monkeypatch):
    arrivals = shared_prefix_workload(seed=7)
    results = []
    for overlap in (True, False):
        s = make_scheduler(TINY_QWEN3, page_size=4, max_running_req=3, num_page_override=24,
                           max_prefill_length=16, overlap=overlap)
        outputs = drive(s, arrivals)
        results.append({uid: [(o.token, o.finished) for o in outs]
                        for uid, outs in outputs.items()})
    assert results[0] == results[1]


def test_overlap_reports_each_batch_one_step_late():
    s = make_scheduler(TINY_QWEN3, overlap=True)
    s.add_request(0, [5, 6, 7], greedy(3))
    assert s.step() == []  # the prefill is launched, its token not read yet
    first = s.step()
    assert [(o.uid, o.finished) for o in first] == [(0, False)]


def count_launches(s: Scheduler, monkeypatch) -> list[list[tuple[int, int, int]]]:
    """Record each launched batch as (uid, cached_len, device_len) of its requests."""
    log: list[list[tuple[int, int, int]]] = []
    real_launch = s._launch

    def launch(batch, *args):
        log.append([(r.uid, r.cached_len, r.device_len) for r in batch.reqs])
        return real_launch(batch, *args)

    monkeypatch.setattr(s, "_launch", launch)
    return log


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_a_request_that_reached_max_tokens_is_not_decoded_again(overlap, monkeypatch):
    # prompt 3 + 3 tokens: one prefill and two decodes; the 3rd token never runs
    s = make_scheduler(TINY_QWEN3, overlap=overlap)
    log = count_launches(s, monkeypatch)
    drive(s, [Arrival(0, 0, [5, 6, 7], 3)])
    assert log == [[(0, 0, 3)], [(0, 3, 4)], [(0, 4, 5)]]


def test_overlap_serves_a_request_of_exactly_max_seq_len():
    # add_request accepts prompt + max_tokens == max_seq_len; the token pool is that wide
    s = make_scheduler(TINY_QWEN3, overlap=True, max_seq_len_override=8)
    outputs = drive(s, [Arrival(0, 0, [5, 6, 7, 8], 4)])
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, [5, 6, 7, 8])[:4]


def test_overlap_fits_in_a_pool_sized_exactly_for_what_admission_reserves():
    # 5 + 5 pages over the two requests' lives (prompt + max_tokens - 1 each): a pool of 10
    s = make_scheduler(TINY_QWEN3, overlap=True, max_running_req=2, num_page_override=10)
    outputs = drive(s, [Arrival(0, 0, [5, 6, 7], 3), Arrival(0, 1, [8, 9, 10, 11], 2)])
    assert [len(outputs[0]), len(outputs[1])] == [3, 2]


def test_overlap_off_reports_each_batch_in_its_own_step():
    s = make_scheduler(TINY_QWEN3, overlap=False)
    s.add_request(0, [5, 6, 7], greedy(3))
    assert [(o.uid, o.finished) for o in s.step()] == [(0, False)]


# --- EOS ------------------------------------------------------------------------------------------

def eos_case(model: str, seed: int) -> tuple[list[int], int, int]:
    """A prompt, a token its greedy continuation produces, and the index where it first does
    (at least 2, so the request decodes a few steps before it stops)."""
    rng = random.Random(seed)
    while True:
        ids = random_ids(rng, rng.randint(4, 30))
        ref = reference(model, ids)
        for k in range(2, REF_TOKENS - 2):
            if ref[k] not in ref[:k]:
                return ids, ref[k], k


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_eos_ends_a_request_at_the_eos_token(overlap, monkeypatch):
    ids, eos, k = eos_case(TINY_QWEN3, seed=1)
    s = make_scheduler(TINY_QWEN3, overlap=overlap, page_size=4, num_page_override=32)
    s.eos_token_ids = frozenset({eos})
    log = count_launches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], ignore_eos=False)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)[: k + 1]
    assert [o.finished for o in outputs[0]] == [False] * k + [True]
    # With overlap the next decode was already launched when the EOS reached the host: that
    # step ran (one batch more than serial) and its token was dropped above.
    assert len(log) == k + 1 + overlap


def test_ignore_eos_runs_past_the_eos_token():
    ids, eos, k = eos_case(TINY_QWEN3, seed=1)
    s = make_scheduler(TINY_QWEN3, overlap=True)
    s.eos_token_ids = frozenset({eos})
    outputs = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], ignore_eos=True)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_eos_frees_a_request_exactly_once_while_others_run_on(overlap, monkeypatch):
    ids, eos, k = eos_case(TINY_QWEN3, seed=2)
    others = [random_ids(random.Random(10 + i), 12) for i in range(2)]
    refs = [reference(TINY_QWEN3, o) for o in others]
    assert all(eos not in r for r in refs)  # only request 0 meets the EOS token
    s = make_scheduler(TINY_QWEN3, overlap=overlap, page_size=2, max_running_req=3,
                       num_page_override=40)
    s.eos_token_ids = frozenset({eos})
    freed: Counter[int] = Counter()
    real_free = s._free

    def counting_free(req: Req) -> None:
        freed[req.uid] += 1
        real_free(req)

    monkeypatch.setattr(s, "_free", counting_free)
    arrivals = [Arrival(0, 0, ids, REF_TOKENS)] + [Arrival(0, i + 1, o, REF_TOKENS)
                                                   for i, o in enumerate(others)]
    outputs = drive(s, arrivals, ignore_eos=False)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)[: k + 1]
    assert [[o.token for o in outputs[i + 1]] for i in range(2)] == refs
    assert freed == {0: 1, 1: 1, 2: 1}
    assert sorted(s.table.free_rows) == [0, 1, 2]
    assert len(s.cache.free_pages) + s.cache.prefix_cache.evictable_size // 2 == 40


# --- rejection ------------------------------------------------------------------------------------

def test_add_request_rejects_an_empty_prompt_without_queueing():
    s = make_scheduler(TINY_QWEN3)
    with pytest.raises(ValueError, match="empty"):
        s.add_request(0, [], greedy(4))
    assert not s.has_work and not s.prefill.pending


def test_add_request_rejects_a_too_long_prompt_naming_the_lengths():
    s = make_scheduler(TINY_QWEN3, max_seq_len_override=50)
    with pytest.raises(ValueError) as info:
        s.add_request(0, list(range(3, 48)), greedy(6))
    message = str(info.value)
    assert all(re.search(rf"\b{n}\b", message) for n in (45, 6, 50)), message
    assert not s.has_work and not s.prefill.pending


def test_add_request_accepts_a_request_of_exactly_max_seq_len():
    s = make_scheduler(TINY_QWEN3, max_seq_len_override=50)
    s.add_request(0, list(range(3, 47)), greedy(6))
    assert len(s.prefill.pending) == 1


# --- chunked prefill ------------------------------------------------------------------------------

def record_batches(s: Scheduler, monkeypatch) -> list[tuple[str, bool, bool]]:
    """Record each launched batch: (phase, has a chunk, decode was runnable when scheduled)."""
    log: list[tuple[str, bool, bool]] = []
    real_schedule = s._schedule

    def schedule():
        runnable = s.decode.runnable
        batch = real_schedule()
        if batch is not None:
            log.append((batch.phase, any(isinstance(r, ChunkedReq) for r in batch.reqs),
                        runnable))
        return batch

    monkeypatch.setattr(s, "_schedule", schedule)
    return log


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_chunked_prefill_alternates_with_decode(overlap, monkeypatch):
    rng = random.Random(3)
    short, long = random_ids(rng, 5), random_ids(rng, 30)
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, max_prefill_length=8,
                       overlap=overlap)
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, short, 20), Arrival(1, 1, long, 3)])
    chunk_steps = [i for i, (_, chunked, _) in enumerate(log) if chunked]
    assert len(chunk_steps) == 3  # 30 tokens in chunks of 8: 3 chunks, then the last 6
    for i in chunk_steps:
        assert log[i + 1][0] == "decode", log
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, short)
    assert [o.token for o in outputs[1]] == reference(TINY_QWEN3, long)[:3]


def test_chunked_prefill_runs_chunks_back_to_back_when_nothing_decodes(monkeypatch):
    rng = random.Random(4)
    long = random_ids(rng, 30)
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, max_prefill_length=8)
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, long, 2)])
    assert [phase for phase, _, _ in log] == ["prefill"] * 4 + ["decode"]
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, long)[:2]


def test_chunked_prefill_computes_each_prompt_token_once():
    rng = random.Random(5)
    ids = random_ids(rng, 37)
    s = make_scheduler(TINY_QWEN3, page_size=2, num_page_override=64, max_prefill_length=5)
    drive(s, [Arrival(0, 0, ids, 4)])
    assert s.prefill_computed_tokens == 37


# --- prefix sharing -------------------------------------------------------------------------------

@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_radix_cache_shares_a_prefix_and_outputs_stay_the_same(overlap):
    rng = random.Random(6)
    base = random_ids(rng, 40)
    prompts = [base + random_ids(rng, 3) for _ in range(3)]
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, overlap=overlap)
    outputs = drive(s, [Arrival(0, i, p, 5) for i, p in enumerate(prompts)])
    assert [[o.token for o in outputs[i]] for i in range(3)] == \
        [reference(TINY_QWEN3, p)[:5] for p in prompts]
    # 40 shared tokens: computed once (the second and third wait a step, then hit the cache)
    assert s.prefill_computed_tokens == 43 + 2 * 3
    assert s.cache.hit_tokens == 2 * 40


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_fully_cached_prompt_still_computes_its_last_token(page_size):
    ids = random_ids(random.Random(11), 8)
    s = make_scheduler(TINY_QWEN3, page_size=page_size, num_page_override=32)
    outputs = drive(s, [Arrival(0, 0, ids, 4), Arrival(6, 1, ids, 4)])  # 1 arrives after 0 ends
    assert [o.token for o in outputs[1]] == [o.token for o in outputs[0]] == \
        reference(TINY_QWEN3, ids)[:4]
    # the second request reuses all but the page holding the last prompt token
    assert s.cache.hit_tokens == 8 - page_size
    assert s.prefill_computed_tokens == 8 + page_size


def test_naive_cache_computes_every_prompt_in_full():
    rng = random.Random(6)
    base = random_ids(rng, 40)
    prompts = [base + random_ids(rng, 3) for _ in range(3)]
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, cache_type="naive")
    outputs = drive(s, [Arrival(0, i, p, 5) for i, p in enumerate(prompts)])
    assert [[o.token for o in outputs[i]] for i in range(3)] == \
        [reference(TINY_QWEN3, p)[:5] for p in prompts]
    assert s.prefill_computed_tokens == 3 * 43 and s.cache.hit_tokens == 0


def test_a_pool_for_one_request_serves_many_by_waiting_and_evicting():
    rng = random.Random(8)
    prompts = [random_ids(rng, 20) for _ in range(4)]
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=pages_for(20 + 8, 4),
                       max_running_req=4)
    outputs = drive(s, [Arrival(0, i, p, 8) for i, p in enumerate(prompts)])
    assert [[o.token for o in outputs[i]] for i in range(4)] == \
        [reference(TINY_QWEN3, p)[:8] for p in prompts]
    assert s.cache.evicted_pages > 0


def test_scheduler_reference_equals_hf_greedy(hf_model, hf_greedy):
    """The one-at-a-time reference the randomized runs compare against is itself right."""
    rng = random.Random(9)
    for model in (TINY_QWEN3, TINY_LLAMA):
        ids = random_ids(rng, 17)
        assert reference(model, ids) == hf_greedy(hf_model(model), ids, REF_TOKENS), model
