"""Chapter 9: the radix cache inside the scheduler. Admission counts evictable pages as available
and a cached prefix as already paid for; the matched prefix is attached to the request's row and
locked; a request sharing a long uncached prefix with one admitted in the same batch waits a
step; cache_req frees duplicate pages and unaligned tails; the integrity check catches a lost
page. End to end: shared prefixes are computed once with unchanged outputs, a fully cached prompt
still computes its last token, the naive cache computes everything, a small pool serves many
requests by evicting, and randomized workloads (radix and naive caches, prompts that reuse
earlier prefixes, tight pools) give each request what it gives alone and leak nothing.
RadixCache on its own is tested in test_radix_cache.py."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import TINY_QWEN3
from minisgl.core import Req
from minisgl.scheduler import Scheduler
from minisgl.scheduler import prefill as prefill_module
from minisgl.scheduler.prefill import DEFER_SHARED_TOKENS, PendingReq, shared_prefix_len
from scheduler_helpers import (Arrival, RandomRunChecks, admit_behind_a_cached_prefix,
                               completed_runs, drive, finish,
                               held_requests, make_scheduler, pages, pending, random_ids,
                               record_adders, record_batches, reference, small_pool, tokens)

CHAPTER = 9  # tools/steps.py check runs this module on chapter 9's own tree


# --- admission with a prefix cache ----------------------------------------------------------------

def test_evictable_cached_pages_count_as_available(monkeypatch):
    s = small_pool(num_pages=4, page_size=4)
    log = record_batches(s, monkeypatch)
    s.prefill.add(pending(0, tokens(0, 9), max_tokens=4))
    for _ in range(4):  # its prefill and 3 decodes: then it has its 4 tokens
        s.step()
    assert not s.has_work
    assert len(s.cache.free_pages) == 1 and s.cache.prefix_cache.evictable_size == 12
    s.prefill.add(pending(1, tokens(100, 10), max_tokens=7))  # 16 tokens: 4 pages
    s.step()
    assert (log[-1].phase, log[-1].uids) == ("prefill", [1])
    # 3 pages for the prompt: the free one and 2 more by eviction, which takes whole nodes: the
    # 4-token leaf, then its 8-token parent
    assert s.cache.evicted_pages == 3 and s.cache.prefix_cache.evictable_size == 0
    assert len(s.cache.free_pages) == 1
    s.cache.check_integrity(held_requests(s))


def test_admission_takes_a_row_and_attaches_the_matched_prefix():
    s = small_pool(num_pages=16, page_size=4)
    req = admit_behind_a_cached_prefix(s)
    owner = next(iter(s.decode.running))
    assert req.cached_len == 8 and req.table_idx != owner.table_idx
    page_table = s.cache.page_table
    assert page_table[req.table_idx, :8].tolist() == page_table[owner.table_idx, :8].tolist()


def prefix_setup():
    """A running request A whose 16-token prefix (4 pages of 4) is cached and locked by it;
    3 pages are free and nothing is evictable."""
    s = small_pool(num_pages=8, page_size=4)
    prompt = tokens(0, 17)
    s.prefill.add(pending(0, prompt, max_tokens=4))  # 20 tokens: 5 pages
    s.step()
    assert len(s.cache.free_pages) == 3 and s.cache.prefix_cache.evictable_size == 0
    assert s.cache.prefix_cache.protected_size == 16 and s.decode.reserved_pages == 0
    return s, prompt


def test_request_with_a_cached_prefix_needs_only_its_uncached_pages(monkeypatch):
    s, prompt = prefix_setup()
    adders = record_adders(monkeypatch)
    s.prefill.add(pending(1, prompt[:16] + [900, 901, 902, 903], max_tokens=1))
    (req,) = s.prefill.schedule_next_batch().reqs
    assert req.cached_len == 16 and req.extend_len == 4
    assert adders[-1].reserved_pages == 1  # 5 pages over its life, 4 of them shared


def test_same_size_request_without_the_prefix_is_not_admitted():
    s, _ = prefix_setup()
    s.prefill.add(pending(1, tokens(500, 20), max_tokens=1))
    assert s.prefill.schedule_next_batch() is None


def test_matched_prefix_is_locked_by_the_admitted_request():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 9), max_tokens=1))  # finishes at once: cached, unlocked
    s.step()
    assert s.cache.prefix_cache.evictable_size == 8
    s.prefill.add(pending(1, tokens(0, 9), max_tokens=3))
    (req,) = s.prefill.schedule_next_batch().reqs
    assert req.cached_len == 8
    assert (s.cache.prefix_cache.evictable_size, s.cache.prefix_cache.protected_size) == (0, 8)
    assert s.cache.hit_tokens == 8


def test_request_that_fits_only_while_its_prefix_is_evictable_waits_unlocked():
    """Its cached prefix counts as evictable until it is locked: a request that fits only with
    those pages is refused, unlocks the prefix again, and runs once pages come back."""
    a, b, c = tokens(0, 9), tokens(500, 13), tokens(0, 8) + tokens(900, 9)
    expected = {1: reference(TINY_QWEN3, b)[:4], 2: reference(TINY_QWEN3, c)[:4]}
    s = small_pool(num_pages=8, page_size=4)
    cache = s.cache.prefix_cache
    s.prefill.add(pending(0, a, max_tokens=1))  # 3 pages; finishes at once, [0..8) stays cached
    s.prefill.add(pending(1, b, max_tokens=4))  # 16 tokens: 4 pages, all taken by its prefill
    outputs = {0: [], 1: [], 2: []}
    for out in s.step():
        outputs[out.uid].append(out.token)
    assert len(s.cache.free_pages) == 2 and s.decode.reserved_pages == 0
    assert (cache.evictable_size, cache.protected_size) == (8, 12)
    # c: 20 tokens = 5 pages, 2 of them cached: it needs 3. 2 free + 2 evictable fit, but
    # locking its prefix leaves 2 free + 0 evictable.
    s.prefill.add(pending(2, c, max_tokens=4))
    assert s.prefill.schedule_next_batch() is None
    assert [p.uid for p in s.prefill.pending] == [2]
    assert (cache.evictable_size, cache.protected_size) == (8, 12)
    s.cache.check_integrity(held_requests(s))
    while s.has_work:  # b decodes and finishes; its pages come back and c runs
        for out in s.step():
            outputs[out.uid].append(out.token)
        s.cache.check_integrity(held_requests(s))
    assert outputs[1] == expected[1] and outputs[2] == expected[2]
    assert s.cache.hit_tokens == 8 and cache.protected_size == 0


def test_an_identical_prompt_matches_all_but_its_last_token():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 8), max_tokens=1))
    s.step()
    assert s.cache.prefix_cache.evictable_size == 8  # the whole prompt is cached
    s.prefill.add(pending(1, tokens(0, 8), max_tokens=2))
    (req,) = s.prefill.schedule_next_batch().reqs
    assert (req.cached_len, req.extend_len) == (4, 4)  # its last token must be computed


# --- deferral of shared prompts -------------------------------------------------------------------

def shared_pair(shared: int) -> list[PendingReq]:
    base = tokens(1000, shared)
    return [pending(0, base + [1, 2, 3], max_tokens=2), pending(1, base + [4, 5, 6], max_tokens=2)]


def test_second_request_sharing_32_uncached_tokens_waits_a_step(monkeypatch):
    s = small_pool(num_pages=128, page_size=1)
    log = record_batches(s, monkeypatch)
    for p in shared_pair(DEFER_SHARED_TOKENS):
        s.prefill.add(p)
    s.step()
    assert log[-1].uids == [0] and [p.uid for p in s.prefill.pending] == [1]
    (second,) = s.prefill.schedule_next_batch().reqs  # now the shared part is cached
    assert second.uid == 1 and second.cached_len == DEFER_SHARED_TOKENS


def test_a_prompt_inside_one_admitted_in_the_same_batch_waits_a_step(monkeypatch):
    s = small_pool(num_pages=128, page_size=1)
    log = record_batches(s, monkeypatch)
    base = tokens(1000, DEFER_SHARED_TOKENS + 1)
    s.prefill.add(pending(0, base + [1, 2, 3], max_tokens=2))
    s.prefill.add(pending(1, base, max_tokens=2))  # shorter: all of it is the first's prefix
    s.step()
    assert log[-1].uids == [0] and [p.uid for p in s.prefill.pending] == [1]
    (second,) = s.prefill.schedule_next_batch().reqs
    assert second.cached_len == DEFER_SHARED_TOKENS  # all but its last token


def test_requests_sharing_fewer_than_32_tokens_are_admitted_together():
    s = small_pool(num_pages=128, page_size=1)
    for p in shared_pair(DEFER_SHARED_TOKENS - 1):
        s.prefill.add(p)
    assert [r.uid for r in s.prefill.schedule_next_batch().reqs] == [0, 1]


def test_a_request_is_compared_only_with_admitted_ones_that_start_with_its_token(monkeypatch):
    # Comparing it with every admitted request would cost the host the square of the batch.
    compared = []
    count = prefill_module.shared_prefix_len
    monkeypatch.setattr(prefill_module, "shared_prefix_len",
                        lambda a, b: compared.append((int(a[0]), int(b[0]))) or count(a, b))
    s = small_pool(num_pages=128, page_size=1)
    for uid, ids in enumerate((tokens(1000, 8), tokens(2000, 8), [1000] + tokens(3000, 7))):
        s.prefill.add(pending(uid, ids, max_tokens=2))
    assert [r.uid for r in s.prefill.schedule_next_batch().reqs] == [0, 1, 2]
    assert compared == [(1000, 1000)]  # the third with the first; the second with nobody


def test_naive_cache_admits_requests_sharing_a_long_prompt_together():
    s = small_pool(num_pages=128, page_size=1, cache_type="naive")
    for p in shared_pair(DEFER_SHARED_TOKENS + 8):
        s.prefill.add(p)
    assert [r.uid for r in s.prefill.schedule_next_batch().reqs] == [0, 1]


def test_shared_tokens_already_cached_do_not_defer():
    s = small_pool(num_pages=128, page_size=1)
    base = tokens(1000, 40)
    s.prefill.add(pending(9, base + [7], max_tokens=1))
    s.step()  # it finishes at once: base is cached now
    for i, tail in enumerate(([1, 2], [3, 4])):
        s.prefill.add(pending(i, base + tail, max_tokens=2))
    assert [(r.uid, r.cached_len) for r in s.prefill.schedule_next_batch().reqs] == \
        [(0, 40), (1, 40)]


# --- cache_req ------------------------------------------------------------------------------------

def computed_alone(s: Scheduler, ids: list[int], max_tokens: int) -> Req:
    """A request admitted alone, given its pages and its prompt computed, by hand: where a
    prefill step calls cache_req."""
    s.prefill.add(pending(0, ids, max_tokens))
    (req,) = s.prefill.schedule_next_batch().reqs
    s.cache.allocate([req])
    req.complete_one()
    return req


def test_cache_req_frees_duplicate_pages_and_switches_to_the_cached_copy():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=4))
    s.prefill.add(pending(1, tokens(0, 10), max_tokens=4))  # shares 9 < 32: same batch
    batch = s.prefill.schedule_next_batch()
    a, b = batch.reqs
    s.cache.allocate(batch.reqs)
    assert len(s.cache.free_pages) == 16 - 6
    b_own = s.cache.page_table[b.table_idx, :8].clone()
    for r in batch.reqs:
        r.complete_one()
    s.cache.cache_req(a, finished=False)
    s.cache.cache_req(b, finished=False)
    row_a, row_b = s.cache.page_table[a.table_idx], s.cache.page_table[b.table_idx]
    assert row_b[:8].tolist() == row_a[:8].tolist()
    assert len(s.cache.free_pages) == 16 - 4
    assert set((b_own[::4] // 4).tolist()) <= set(s.cache.free_pages)
    s.cache.check_integrity([a, b])


def test_cache_req_switches_only_the_duplicate_part_of_a_longer_prompt():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=4))
    s.prefill.add(pending(1, tokens(0, 8) + tokens(500, 6), max_tokens=4))  # same batch
    batch = s.prefill.schedule_next_batch()
    a, b = batch.reqs
    s.cache.allocate(batch.reqs)
    assert len(s.cache.free_pages) == 16 - 3 - 4
    b_own = s.cache.page_table[b.table_idx, :12].clone()
    for r in batch.reqs:
        r.complete_one()
    s.cache.cache_req(a, finished=False)  # caches [0..8)
    s.cache.cache_req(b, finished=False)  # [0..8) is a duplicate now, [8..12) is new
    row_a, row_b = s.cache.page_table[a.table_idx], s.cache.page_table[b.table_idx]
    assert row_b[:8].tolist() == row_a[:8].tolist() and row_b[8:12].equal(b_own[8:])
    assert len(s.cache.free_pages) == 16 - 3 - 4 + 2
    s.cache.check_integrity([a, b])


def test_cache_req_of_a_finished_request_frees_its_unaligned_tail():
    s = small_pool(num_pages=16, page_size=4)
    req = computed_alone(s, tokens(0, 10), max_tokens=1)
    s.cache.cache_req(req, finished=False)  # 8 of 10 tokens cached, the tail page is held
    assert len(s.cache.free_pages) == 13 and s.cache.held_pages([req]) == 1
    tail_page = int(s.cache.page_table[req.table_idx, 8]) // 4
    s.cache.cache_req(req, finished=True)
    assert len(s.cache.free_pages) == 14 and tail_page in s.cache.free_pages
    assert (s.cache.prefix_cache.evictable_size, s.cache.prefix_cache.protected_size) == (8, 0)
    assert s.cache.handles == {}
    s.cache.check_integrity([])


def test_cache_req_of_a_running_request_locks_its_new_prefix():
    s = small_pool(num_pages=16, page_size=4)
    req = computed_alone(s, tokens(0, 13), max_tokens=3)
    s.cache.cache_req(req, finished=False)
    assert s.cache.handles[req].cached_len == 12
    assert (s.cache.prefix_cache.evictable_size, s.cache.prefix_cache.protected_size) == (0, 12)


def test_naive_cache_req_of_a_finished_request_frees_every_page():
    s = small_pool(num_pages=16, page_size=4, cache_type="naive")
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=3))
    s.step()  # its prefill
    s.step()  # a decode
    assert len(s.cache.free_pages) == 13
    finish(s, next(iter(s.decode.running)))
    assert sorted(s.cache.free_pages) == list(range(16))


def test_check_integrity_catches_a_lost_page():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=3))
    s.step()
    s.cache.check_integrity(held_requests(s))
    s.cache.free_pages.pop()
    with pytest.raises(AssertionError, match="16 pages"):
        s.cache.check_integrity(held_requests(s))


def test_check_integrity_catches_a_page_free_twice():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=3))
    s.step()
    s.cache.free_pages[-1] = s.cache.free_pages[0]  # the count stays right
    with pytest.raises(AssertionError, match="16 pages"):
        s.cache.check_integrity(held_requests(s))


def test_check_integrity_checks_the_prefix_cache_too():
    s = small_pool(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 9), max_tokens=1))
    s.step()  # it finished: [0..8) is cached
    (node,) = s.cache.prefix_cache.root.children.values()
    node.key = [99] + node.key[1:]  # no page moves, but the tree is broken
    with pytest.raises(AssertionError, match="not filed under its first page"):
        s.cache.check_integrity(held_requests(s))


# --- prefix sharing end to end --------------------------------------------------------------------

def test_radix_cache_shares_a_prefix_and_outputs_stay_the_same():
    rng = random.Random(6)
    base = random_ids(rng, 40)
    prompts = [base + random_ids(rng, 3) for _ in range(3)]
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64)
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
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=pages(20 + 8, 4),
                       max_running_req=4)
    outputs = drive(s, [Arrival(0, i, p, 8) for i, p in enumerate(prompts)])
    assert [[o.token for o in outputs[i]] for i in range(4)] == \
        [reference(TINY_QWEN3, p)[:8] for p in prompts]
    assert s.cache.evicted_pages > 0


# --- randomized runs ------------------------------------------------------------------------------

SEEDS = [0, 2, 7, 9]  # radix (page size 1, 16, 2) and naive (page size 4); both models


@pytest.mark.parametrize("seed", SEEDS)
class TestRandomRun(RandomRunChecks):
    chapter = CHAPTER


def test_random_workloads_cover_waiting_hits_and_eviction():
    """Among the runs that completed, some queued requests behind a full pool, hit the radix
    cache and evicted from it, and the naive cache ran too."""
    done = completed_runs(SEEDS, CHAPTER)
    assert [seed for seed, run in done.items() if run.stats["waited"] > 0]
    assert [seed for seed, run in done.items() if run.scheduler.cache.hit_tokens > 0]
    assert [seed for seed, run in done.items() if run.scheduler.cache.evicted_pages > 0]
    assert {run.workload.config["cache_type"] for run in done.values()} == {"radix", "naive"}


# --- the chapter's example ---

from processes import run_example  # noqa: E402


def test_example_walks_a_radix_tree():
    out = run_example("ch09_radix_cache.py")
    # page_size=2: only whole pages are cached. [1..6] goes in as one edge with slots 10..15.
    # [1,2,3,4,9,9,7] shares [1,2,3,4] (4 tokens), adds [9,9] (slots 24, 25) and drops the 7
    # (half a page); the edge splits after 4 tokens. [1,2,3,4,5,6,8] matches 6 tokens; locking
    # them leaves only [9,9] evictable, and evicting 2 tokens takes exactly that leaf.
    tree_after_split = ["   [1, 2, 3, 4] → slots [10, 11, 12, 13] ref={r}",
                        "      [9, 9] → slots [24, 25] ref=0",
                        "      [5, 6] → slots [14, 15] ref={r}"]
    expected = [
        "插入 [1..6]：可淘汰 6 个 token，被锁 0 个",
        "   [1, 2, 3, 4, 5, 6] → slots [10, 11, 12, 13, 14, 15] ref=0",
        "插入 [1,2,3,4,9,9,7]：前 4 个已在树里，只收整页，handle 长度 6",
        "边 [1..6] 在第 4 个 token 处被切开：可淘汰 8 个 token，被锁 0 个",
        *[line.format(r=0) for line in tree_after_split],
        "匹配 [1,2,3,4,5,6,8]：命中 6 个，slots [10, 11, 12, 13, 14, 15]",
        "锁住这个前缀：可淘汰 2 个 token，被锁 6 个",
        *[line.format(r=1) for line in tree_after_split],
        "淘汰 2 个 token，拿回 slots [24, 25]",
        "淘汰后：可淘汰 0 个 token，被锁 6 个",
        "   [1, 2, 3, 4] → slots [10, 11, 12, 13] ref=1",
        "      [5, 6] → slots [14, 15] ref=1",
    ]
    assert out.splitlines() == expected


def test_shared_prefix_len_counts_the_leading_equal_tokens():
    ids = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
    assert shared_prefix_len(ids, torch.tensor([5, 6, 9, 8], dtype=torch.int32)) == 2
    assert shared_prefix_len(ids, ids[:3]) == 3  # one is a prefix of the other
    assert shared_prefix_len(ids, torch.tensor([4, 6, 7, 8], dtype=torch.int32)) == 0
    assert shared_prefix_len(ids, ids[:0]) == 0
