"""What the scheduler tests of chapters 7 to 14 share: a scheduler on a tiny model, a loop that
feeds it requests at given steps, each prompt's output run alone (the reference), random
workloads, and ways to watch what it schedules.

Every chapter's tree receives this module, so it imports only what chapter 7 has; what later
chapters add is looked up where a tree has it. A test of an earlier chapter turns later features
off (prefix sharing, overlap), so it checks on the final package what it checks on its own tree.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass

import torch

from conftest import MODELS_DIR, TINY_LLAMA, TINY_QWEN3
from minisgl.core import Req, SamplingParams, set_global_ctx
from minisgl.scheduler import Scheduler, SchedulerConfig, TokenOutput
from minisgl.scheduler import prefill as prefill_module
from minisgl.scheduler.prefill import PendingReq

VOCAB = 49152  # both tiny models
REF_TOKENS = 20  # references are computed once per prompt for this many tokens (greedy: a
# request with max_tokens=m gives the first m of them)

CONFIG_FIELDS = {f.name for f in dataclasses.fields(SchedulerConfig)}
# From chapter 10 (chunked prefill) on, running requests ride in every prefill step, one token
# each (a mixed batch); the tests of chapters 7-9 also run on the final package.
MIXED_BATCHES = hasattr(prefill_module, "ChunkedReq")
# Chapter 9's prefix cache off: the tests of chapters 7 and 8 pass this (empty before chapter 9).
NO_PREFIX_SHARING = {"cache_type": "naive"} if "cache_type" in CONFIG_FIELDS else {}


def pages(num_tokens: int, page_size: int) -> int:
    """ceil(num_tokens / page_size), computed here rather than by the code under test."""
    return -(-num_tokens // page_size)


def make_scheduler(model: str, **options) -> Scheduler:
    """A scheduler on models/<model>, float32. `options` override the defaults; overlap
    (chapter 11) is off unless they turn it on."""
    config = dict(max_running_req=4, page_size=1, num_page_override=256,
                  max_seq_len_override=None)
    if "overlap" in CONFIG_FIELDS:
        config["overlap"] = False
    config.update(options)
    return Scheduler(SchedulerConfig(str(MODELS_DIR / model), dtype=torch.float32, **config))


def small_pool(num_pages: int, page_size: int, rows: int = 4, **options) -> Scheduler:
    """A scheduler on tiny-qwen3 whose managers (table, cache, decode, prefill) a test drives
    itself: a KV pool of `num_pages` pages of `page_size` tokens and `rows` page-table rows."""
    return make_scheduler(TINY_QWEN3, num_page_override=num_pages, page_size=page_size,
                          max_running_req=rows, **options)


def greedy(max_tokens: int, ignore_eos: bool = True) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)


def pending(uid: int, ids: list[int], max_tokens: int) -> PendingReq:
    """A request as add_request queues it, for tests that drive the managers themselves."""
    return PendingReq(uid, torch.tensor(ids, dtype=torch.int32), greedy(max_tokens))


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def admit_behind_a_cached_prefix(s: Scheduler) -> Req:
    """Request 0 (tokens 0..9) runs its prefill step; then request 1 (tokens 0..7, 500, 501) is
    admitted by schedule_next_batch and returned. With a page size of 4 its first 8 tokens are
    matched in the prefix cache (chapter 9 on)."""
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=4))
    s.step()
    s.prefill.add(pending(1, tokens(0, 8) + [500, 501], max_tokens=4))
    (req,) = s.prefill.schedule_next_batch().reqs
    return req


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]  # no BOS/EOS ids


@dataclass
class Arrival:
    step: int
    uid: int
    ids: list[int]
    max_tokens: int


def held_requests(s: Scheduler) -> list[Req]:
    """Every request that holds pages outside the prefix cache right now: the running ones,
    the chunk of a prompt whose prefill is not complete (chapter 10), and with overlap
    (chapter 11) those done but still inside the batch in flight and every request of that
    batch (one that reached max_tokens there is in neither set yet)."""
    held: dict[Req, None] = dict.fromkeys(s.decode.running)
    held.update(dict.fromkeys(getattr(s, "finished", ())))
    in_flight = getattr(s, "in_flight", None)
    if in_flight is not None:
        held.update(dict.fromkeys(in_flight.batch.reqs))
    held.update(dict.fromkeys(p.chunk for p in s.prefill.pending
                              if getattr(p, "chunk", None) is not None))
    return list(held)


def check_pages(s: Scheduler) -> None:
    """Every KV page is in exactly one place. From chapter 9 the cache manager checks that itself
    (free, in the prefix cache, or held by a request); before, a page is free or held by a running
    request, which holds the pages of its tokens [0, cached_len)."""
    if hasattr(s.cache, "check_integrity"):
        s.cache.check_integrity(held_requests(s))
        return
    free, size = s.cache.free_pages, s.engine.page_size
    held = sum(pages(r.cached_len, size) for r in s.decode.running)
    assert len(set(free)) == len(free), "a page is free twice"
    assert len(free) + held == s.engine.num_pages, (len(free), held, s.engine.num_pages)


def drive(s: Scheduler, arrivals: list[Arrival], check_every_step: bool = True,
          ignore_eos: bool = True, stats: Counter | None = None) -> dict[int, list[TokenOutput]]:
    """Add each request at its arrival step and step until everything has finished; returns
    each uid's TokenOutputs in order. With check_every_step, check_pages runs after every step.
    `stats["waited"]` counts the steps after which an arrived request was still waiting for
    admission, `stats["waited_for_pages"]` those of them with a page-table row free, and
    `stats["batched"]` those that gave tokens to more than one request."""
    stats = Counter() if stats is None else stats
    set_global_ctx(s.engine.ctx)  # the engine created last owns the Context: take it back
    outputs: dict[int, list[TokenOutput]] = {a.uid: [] for a in arrivals}
    waiting = sorted(arrivals, key=lambda a: a.step)  # stable: same-step order is kept
    step = 0
    while waiting or s.has_work:
        while waiting and waiting[0].step <= step:
            a = waiting.pop(0)
            s.add_request(a.uid, a.ids, greedy(a.max_tokens, ignore_eos))
        results = s.step()
        for out in results:
            outputs[out.uid].append(out)
        stats["batched"] += len(results) > 1
        # A prompt with a chunk computed (chapter 10) has been admitted: it is not waiting.
        queued = any(getattr(p, "chunk", None) is None for p in s.prefill.pending)
        stats["waited"] += queued
        stats["waited_for_pages"] += queued and s.table.available > 0
        if check_every_step:
            check_pages(s)
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
                           num_page_override=len(ids) + REF_TOKENS)
        out = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], check_every_step=False)
        _REFERENCES[key] = [o.token for o in out[0]]
    return _REFERENCES[key]


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


def assert_eos_frees_a_request_exactly_once(monkeypatch, **options) -> None:
    """Request 0 meets a token of its greedy output made an EOS token and stops there, while two
    others run on to max_tokens: every request is freed exactly once, and each row and page is
    back (free, or in the prefix cache from chapter 9). `options` go to make_scheduler."""
    ids, eos, k = eos_case(TINY_QWEN3, seed=2)
    others = [random_ids(random.Random(10 + i), 12) for i in range(2)]
    refs = [reference(TINY_QWEN3, o) for o in others]
    assert all(eos not in r for r in refs)  # only request 0 meets the EOS token
    s = make_scheduler(TINY_QWEN3, page_size=2, max_running_req=3, num_page_override=40,
                       **options)
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
    prefix_cache = getattr(s.cache, "prefix_cache", None)  # chapter 9
    cached = prefix_cache.evictable_size // 2 if prefix_cache is not None else 0
    assert len(set(s.cache.free_pages)) == len(s.cache.free_pages) == 40 - cached


# --- watching what the scheduler does -------------------------------------------------------------

@dataclass
class BatchRecord:
    phase: str
    reqs: list[tuple[int, int, int, str]]  # (uid, cached_len, device_len, type name) at launch
    decode_runnable: bool  # whether running requests could have decoded instead

    @property
    def uids(self) -> list[int]:
        return [uid for uid, *_ in self.reqs]

    @property
    def chunked(self) -> bool:
        return any(kind == "ChunkedReq" for *_, kind in self.reqs)


def record_batches(s: Scheduler, monkeypatch) -> list[BatchRecord]:
    """Record every batch the scheduler runs, as it is handed on after scheduling: before the
    forward advances the lengths (so also before the launch, with overlap). That is _prepare
    until chapter 17; from chapter 18, where the engine prepares batches, _launch."""
    log: list[BatchRecord] = []
    hook = "_prepare" if hasattr(s, "_prepare") else "_launch"
    real_prepare = getattr(s, hook)

    def prepare(batch, *args):
        log.append(BatchRecord(batch.phase, [(r.uid, r.cached_len, r.device_len, type(r).__name__)
                                             for r in batch.reqs], s.decode.runnable))
        return real_prepare(batch, *args)

    monkeypatch.setattr(s, hook, prepare)
    return log


def record_adders(monkeypatch) -> list:
    """The PrefillAdder (chapter 8) that each PrefillManager.schedule_next_batch builds, so a
    test can read what it reserved."""
    from minisgl.scheduler import prefill

    adders = []
    real_adder = prefill.PrefillAdder

    def adder(*args, **kwargs):
        adders.append(real_adder(*args, **kwargs))
        return adders[-1]

    monkeypatch.setattr(prefill, "PrefillAdder", adder)
    return adders


def finish(s: Scheduler, req: Req) -> None:
    """End a running request now, as the scheduler does when it finishes."""
    s.decode.remove(req)
    s._free(req)


# --- random workloads -----------------------------------------------------------------------------

@dataclass
class Workload:
    model: str
    config: dict
    arrivals: list[Arrival]


def random_workload(seed: int, chapter: int) -> Workload:
    """A small random workload for the scheduler as chapter `chapter` (7 to 11) has it. Page
    size and model cycle with the seed; the rest is drawn, the same way for every chapter, and
    what the workload may exercise grows with the chapter:
      7  requests arrive at random steps and wait for a free row; the pool holds all of them
         (chapter 7 admits by rows only);
      8  the pool barely fits the largest request: requests wait for pages too;
      9  a radix cache (naive every third seed); half the prompts reuse an earlier prefix;
      10 prompts are cut into chunks (a random max_prefill_length);
      11 overlap on (for half the seeds) and off.
    Before chapter 9 the prefix cache is naive on trees that have one, before 11 overlap is off.
    """
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
    # add_request wants prompt + max_tokens <= pool slots; admission wants
    # pages(prompt + max_tokens - 1). Take the stricter one, plus at most one page.
    largest = max(pages(len(a.ids) + a.max_tokens, page_size) for a in arrivals)
    config = dict(page_size=page_size, max_running_req=rng.randint(1, 6),
                  num_page_override=largest + rng.randint(0, 1))
    max_prefill_length = rng.choice([rng.randint(1, 8), rng.randint(1, 8), rng.randint(9, 64),
                                     8192])
    if chapter < 8:
        config["num_page_override"] = sum(pages(len(a.ids) + a.max_tokens, page_size)
                                          for a in arrivals)
    if chapter < 9:
        config.update(NO_PREFIX_SHARING)
    else:
        config["cache_type"] = cache_type
    if chapter >= 10:
        config["max_prefill_length"] = max_prefill_length
    if chapter >= 11:
        config["overlap"] = overlap
    return Workload(model, config, arrivals)


@dataclass
class Run:
    workload: Workload
    scheduler: Scheduler
    outputs: dict[int, list[TokenOutput]]
    stats: Counter


_RUNS: dict[tuple[int, int], Run | Exception] = {}


def run_seed(seed: int, chapter: int) -> Run:
    """Each (seed, chapter) workload is run once and shared by that chapter's per-seed tests
    (references first, each on its own scheduler). A run that raised raises again in every test
    of its seed, and only there."""
    key = (seed, chapter)
    if key not in _RUNS:
        try:
            w = random_workload(seed, chapter)
            for a in w.arrivals:
                reference(w.model, a.ids)
            s, stats = make_scheduler(w.model, **w.config), Counter()
            _RUNS[key] = Run(w, s, drive(s, w.arrivals, stats=stats), stats)
        except Exception as error:  # noqa: BLE001 - re-raised below, per test
            _RUNS[key] = error
    result = _RUNS[key]
    if isinstance(result, Exception):
        raise result
    return result


def completed_runs(seeds: list[int], chapter: int) -> dict[int, Run]:
    """The runs of `seeds` that did not raise (a failing seed is reported by its own tests), at
    least half of them."""
    done: dict[int, Run] = {}
    for seed in seeds:
        try:
            done[seed] = run_seed(seed, chapter)
        except Exception:  # noqa: BLE001
            pass
    assert len(done) >= len(seeds) // 2, f"only seeds {sorted(done)} of {seeds} completed"
    return done


def assert_finishes_every_request_once_with_max_tokens(run: Run) -> None:
    for a in run.workload.arrivals:
        flags = [o.finished for o in run.outputs[a.uid]]
        assert len(flags) == a.max_tokens, a.uid
        assert flags.count(True) == 1 and flags[-1], a.uid


def assert_equals_each_request_run_alone(run: Run) -> None:
    w = run.workload
    for a in w.arrivals:
        got = [o.token for o in run.outputs[a.uid]]
        assert got == reference(w.model, a.ids)[: a.max_tokens], (a.uid, w.config)


def assert_every_page_and_row_free(run: Run) -> None:
    """After a run without prefix sharing (chapters 7 and 8): nothing left to do, every page and
    every row free, each exactly once."""
    s, rows = run.scheduler, run.workload.config["max_running_req"]
    assert not s.has_work
    assert sorted(s.cache.free_pages) == list(range(s.engine.num_pages))
    assert sorted(s.table.free_rows) == list(range(rows)) and s.table.available == rows


def assert_leaks_no_page_and_no_row(run: Run) -> None:
    """After a run (chapter 9 on): nothing left to do, no request holds a prefix, every page is
    free or (radix) in the prefix cache unlocked, every row is free."""
    s, config = run.scheduler, run.workload.config
    cache, size = s.cache, s.engine.page_size
    assert not s.has_work
    assert cache.handles == {}
    assert cache.prefix_cache.protected_size == 0
    assert len(set(cache.free_pages)) == len(cache.free_pages)
    if config["cache_type"] == "radix":
        cached = cache.prefix_cache.evictable_size // size
        assert len(cache.free_pages) + cached == s.engine.num_pages
    else:
        assert len(cache.free_pages) == s.engine.num_pages
    assert s.table.available == config["max_running_req"]
    assert sorted(s.table.free_rows) == list(range(config["max_running_req"]))


class RandomRunChecks:
    """What every randomized run of chapters 7 to 11 must give: each request exactly max_tokens
    tokens, finished once; the tokens it gives run alone; no page or row leaked. A test module
    subclasses it as `TestRandomRun`, sets `chapter`, and parametrizes the class over its seeds
    (`@pytest.mark.parametrize("seed", SEEDS)`): each (seed, chapter) workload runs once
    (run_seed) and every method checks that run."""

    chapter: int

    def test_finishes_every_request_once_with_max_tokens(self, seed):
        assert_finishes_every_request_once_with_max_tokens(run_seed(seed, self.chapter))

    def test_equals_each_request_run_alone(self, seed):
        assert_equals_each_request_run_alone(run_seed(seed, self.chapter))

    def test_leaks_no_page_and_no_row(self, seed):
        self.assert_no_leak(run_seed(seed, self.chapter))

    def assert_no_leak(self, run: Run) -> None:
        """Chapters 7 and 8 share no prefix: every page and row is free after the run. From
        chapter 9 the prefix cache may keep pages, unlocked."""
        if self.chapter < 9:
            assert_every_page_and_row_free(run)
        else:
            assert_leaks_no_page_and_no_row(run)
