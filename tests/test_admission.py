"""Admission on its own: PrefillAdder / PrefillManager / DecodeManager / CacheManager over a fake
page table (no model). What a request needs over its whole life, when it is admitted, FIFO
order, free rows, prefix hits, deferral of shared prompts, chunking, and what cache_req frees."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.scheduler.cache import CacheManager, pages_for
from minisgl.scheduler.decode import DecodeManager, pages_to_finish
from minisgl.scheduler.prefill import (DEFER_SHARED_TOKENS, ChunkedReq, PendingReq, PrefillAdder,
                                       PrefillManager)
from minisgl.scheduler.table import TableManager

CHAPTER = 8  # tools/steps.py check runs this module on chapter 8's own tree


@dataclass
class Setup:
    table: TableManager
    cache: CacheManager
    decode: DecodeManager
    prefill: PrefillManager

    def adder(self, budget: int = 8192) -> PrefillAdder:
        return PrefillAdder(self.table, self.cache, self.decode.reserved_pages, budget)

    def schedule(self) -> Batch | None:
        return self.prefill.schedule_next_batch()

    def run(self, batch: Batch) -> None:
        """What the scheduler does around a forward: slots for the new tokens, lengths advance,
        a completed prompt goes into the prefix cache, its request starts decoding, and the
        sampled token (a dummy here) reaches the host."""
        self.cache.allocate(batch.reqs)
        for req in batch.reqs:
            req.complete_one()
        for req in batch.reqs:
            if isinstance(req, ChunkedReq):
                continue
            if batch.is_prefill:
                self.cache.cache_req(req, finished=False)
            if req.can_decode:
                self.decode.add(req)
            req.append_host(7)

    def finish(self, req: Req) -> None:
        self.decode.remove(req)
        self.cache.cache_req(req, finished=True)
        self.table.free(req.table_idx)

    def running(self) -> list[Req]:
        held = list(self.decode.running)
        held += [p.chunk for p in self.prefill.pending if p.chunk is not None]
        return held


def make(num_pages: int, page_size: int, rows: int = 4, cache_type: str = "radix",
         max_prefill_length: int = 8192, width: int = 256) -> Setup:
    page_table = torch.zeros(rows, width, dtype=torch.int32)
    table = TableManager(page_table)
    cache = CacheManager(num_pages, page_size, page_table, cache_type)
    decode = DecodeManager(page_size)
    return Setup(table, cache, decode, PrefillManager(table, cache, decode, max_prefill_length))


def pending(uid: int, ids: list[int], max_tokens: int) -> PendingReq:
    return PendingReq(uid, torch.tensor(ids, dtype=torch.int32),
                      SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def new_req(prompt_len: int, output_len: int, forwards: int = 0) -> Req:
    """A request after `forwards` forward passes (its prefill, then decodes)."""
    req = Req(torch.arange(prompt_len, dtype=torch.int32), table_idx=0, cached_len=0,
              output_len=output_len, uid=0, sampling_params=SamplingParams(max_tokens=output_len))
    for _ in range(forwards):
        req.complete_one()
    return req


# --- what a request needs -----------------------------------------------------------------------

@pytest.mark.parametrize("num_tokens,page_size,pages", [
    (0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (7, 1, 7), (16, 16, 1), (17, 16, 2)])
def test_pages_for_rounds_up_to_whole_pages(num_tokens, page_size, pages):
    assert pages_for(num_tokens, page_size) == pages


def test_pending_request_needs_kv_for_prompt_and_all_but_the_last_output():
    assert pending(0, tokens(0, 10), max_tokens=5).total_tokens == 14


@pytest.mark.parametrize("page_size,forwards,pages", [(4, 0, 2), (4, 1, 0), (1, 0, 8),
                                                      (1, 1, 3), (2, 1, 1), (1, 3, 1)])
def test_pages_to_finish_counts_pages_up_to_the_last_token_with_kv(page_size, forwards, pages):
    # prompt 5, 4 outputs: 8 tokens ever get K/V (the last sampled token never runs)
    assert pages_to_finish(new_req(5, 4, forwards), page_size) == pages


def test_decode_reserved_pages_sum_over_running_requests():
    decode = DecodeManager(4)
    a, b = new_req(5, 4), new_req(3, 10)  # 2 pages, then pages_for(12) = 3
    decode.add(a)
    decode.add(b)
    assert decode.reserved_pages == 5
    decode.remove(a)
    assert decode.reserved_pages == 3


def test_decode_batch_holds_running_requests_in_insertion_order():
    decode = DecodeManager(1)
    assert decode.schedule_next_batch() is None and not decode.runnable
    a, b = new_req(2, 3), new_req(4, 3)
    decode.add(b)
    decode.add(a)
    decode.add(b)  # already there: no duplicate
    batch = decode.schedule_next_batch()
    assert batch.is_decode and batch.reqs == [b, a]
    decode.remove(b)
    decode.remove(b)  # removing twice is harmless
    assert decode.schedule_next_batch().reqs == [a]


def test_table_rows_are_allocated_and_freed():
    table = TableManager(torch.zeros(3, 8, dtype=torch.int32))
    assert table.available == 3 and table.token_pool.shape == (3, 8)
    rows = {table.allocate(), table.allocate()}
    assert table.available == 1 and len(rows) == 2
    table.free(rows.pop())
    assert table.available == 2


# --- admission by pages -------------------------------------------------------------------------

def test_request_whose_whole_life_fits_exactly_is_admitted():
    s = make(num_pages=5, page_size=4)
    adder = s.adder()
    req = adder.try_add(pending(0, tokens(0, 10), max_tokens=11))  # 20 tokens: 5 pages
    assert req is not None and adder.reserved_pages == 5
    assert s.table.available == 3


def test_request_one_token_over_the_pool_is_not_admitted():
    s = make(num_pages=5, page_size=4)
    adder = s.adder()
    assert adder.try_add(pending(0, tokens(0, 10), max_tokens=12)) is None  # 21 tokens
    assert adder.reserved_pages == 0 and s.table.available == 4


def test_admission_leaves_room_for_what_running_requests_are_owed():
    s = make(num_pages=5, page_size=4)
    s.prefill.add(pending(0, tokens(0, 4), max_tokens=9))  # 12 tokens: 3 pages
    s.run(s.schedule())
    assert len(s.cache.free_pages) == 4 and s.decode.reserved_pages == 2
    assert s.adder().try_add(pending(1, tokens(100, 7), max_tokens=2)) is not None  # 2 pages
    assert s.adder().try_add(pending(2, tokens(200, 8), max_tokens=3)) is None  # 3 pages


def test_evictable_cached_pages_count_as_available():
    s = make(num_pages=4, page_size=4)
    s.prefill.add(pending(0, tokens(0, 9), max_tokens=4))
    batch = s.schedule()
    s.run(batch)
    for _ in range(3):
        s.run(s.decode.schedule_next_batch())
    s.finish(batch.reqs[0])
    assert len(s.cache.free_pages) == 1 and s.cache.prefix_cache.evictable_size == 12
    s.prefill.add(pending(1, tokens(100, 10), max_tokens=7))  # 16 tokens: 4 pages
    batch = s.schedule()
    assert batch is not None
    s.run(batch)  # 3 pages for the prompt: the free one and 2 more by eviction, which takes
    # whole nodes: the 4-token leaf, then its 8-token parent
    assert s.cache.evicted_pages == 3 and s.cache.prefix_cache.evictable_size == 0
    assert len(s.cache.free_pages) == 1
    s.cache.check_integrity(s.running())


def test_first_request_that_does_not_fit_blocks_those_behind_it():
    s = make(num_pages=4, page_size=4)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=1))  # 5 pages: never now
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=1))  # 1 page: would fit
    assert s.schedule() is None
    assert [p.uid for p in s.prefill.pending] == [0, 1]
    assert s.table.available == 4 and len(s.cache.free_pages) == 4


def test_requests_are_admitted_in_arrival_order_until_one_does_not_fit():
    s = make(num_pages=4, page_size=4)
    s.prefill.add(pending(0, tokens(0, 3), max_tokens=2))  # 1 page
    s.prefill.add(pending(1, tokens(100, 16), max_tokens=2))  # 5 pages: not now
    s.prefill.add(pending(2, tokens(200, 3), max_tokens=2))  # 1 page, but behind uid 1
    batch = s.schedule()
    assert [r.uid for r in batch.reqs] == [0]
    assert [p.uid for p in s.prefill.pending] == [1, 2]


def test_no_free_row_admits_nothing():
    s = make(num_pages=64, page_size=1, rows=1)
    s.prefill.add(pending(0, tokens(0, 3), max_tokens=4))
    s.run(s.schedule())
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=4))
    assert s.table.available == 0
    assert s.schedule() is None and len(s.prefill.pending) == 1


def test_admission_takes_a_row_and_attaches_the_matched_prefix():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=4))
    s.run(s.schedule())
    s.prefill.add(pending(1, tokens(0, 8) + [500, 501], max_tokens=4))
    (req,) = s.schedule().reqs
    owner = next(iter(s.decode.running))
    assert req.cached_len == 8 and req.table_idx != owner.table_idx
    page_table = s.cache.page_table
    assert page_table[req.table_idx, :8].tolist() == page_table[owner.table_idx, :8].tolist()
    assert s.table.token_pool[req.table_idx, 8:10].tolist() == [500, 501]


# --- prefix hits ----------------------------------------------------------------------------------

def prefix_setup() -> tuple[Setup, list[int]]:
    """A running request A whose 16-token prefix (4 pages of 4) is cached and locked by it;
    3 pages are free and nothing is evictable."""
    s = make(num_pages=8, page_size=4)
    prompt = tokens(0, 17)
    s.prefill.add(pending(0, prompt, max_tokens=4))  # 20 tokens: 5 pages
    s.run(s.schedule())
    assert len(s.cache.free_pages) == 3 and s.cache.prefix_cache.evictable_size == 0
    assert s.cache.prefix_cache.protected_size == 16 and s.decode.reserved_pages == 0
    return s, prompt


def test_request_with_a_cached_prefix_needs_only_its_uncached_pages():
    s, prompt = prefix_setup()
    adder = s.adder()
    req = adder.try_add(pending(1, prompt[:16] + [900, 901, 902, 903], max_tokens=1))
    assert req is not None and req.cached_len == 16 and req.extend_len == 4
    assert adder.reserved_pages == 1  # 5 pages over its life, 4 of them shared


def test_same_size_request_without_the_prefix_is_not_admitted():
    s, _ = prefix_setup()
    assert s.adder().try_add(pending(1, tokens(500, 20), max_tokens=1)) is None


def test_matched_prefix_is_locked_by_the_admitted_request():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 9), max_tokens=1))  # finishes at once: cached, unlocked
    batch = s.schedule()
    s.run(batch)
    s.finish(batch.reqs[0])
    assert s.cache.prefix_cache.evictable_size == 8
    req = s.adder().try_add(pending(1, tokens(0, 9), max_tokens=3))
    assert req.cached_len == 8
    assert (s.cache.prefix_cache.evictable_size, s.cache.prefix_cache.protected_size) == (0, 8)
    assert s.cache.hit_tokens == 8


def test_an_identical_prompt_matches_all_but_its_last_token():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 8), max_tokens=1))
    batch = s.schedule()
    s.run(batch)
    s.finish(batch.reqs[0])
    assert s.cache.prefix_cache.evictable_size == 8  # the whole prompt is cached
    req = s.adder().try_add(pending(1, tokens(0, 8), max_tokens=2))
    assert (req.cached_len, req.extend_len) == (4, 4)  # its last token must be computed


# --- deferral of shared prompts -------------------------------------------------------------------

def shared_pair(shared: int) -> list[PendingReq]:
    base = tokens(1000, shared)
    return [pending(0, base + [1, 2, 3], max_tokens=2), pending(1, base + [4, 5, 6], max_tokens=2)]


def test_second_request_sharing_32_uncached_tokens_waits_a_step():
    s = make(num_pages=128, page_size=1)
    for p in shared_pair(DEFER_SHARED_TOKENS):
        s.prefill.add(p)
    batch = s.schedule()
    assert [r.uid for r in batch.reqs] == [0] and [p.uid for p in s.prefill.pending] == [1]
    s.run(batch)
    (second,) = s.schedule().reqs  # now the shared part is cached
    assert second.uid == 1 and second.cached_len == DEFER_SHARED_TOKENS


def test_requests_sharing_fewer_than_32_tokens_are_admitted_together():
    s = make(num_pages=128, page_size=1)
    for p in shared_pair(DEFER_SHARED_TOKENS - 1):
        s.prefill.add(p)
    assert [r.uid for r in s.schedule().reqs] == [0, 1]


def test_naive_cache_admits_requests_sharing_a_long_prompt_together():
    s = make(num_pages=128, page_size=1, cache_type="naive")
    for p in shared_pair(DEFER_SHARED_TOKENS + 8):
        s.prefill.add(p)
    assert [r.uid for r in s.schedule().reqs] == [0, 1]


def test_shared_tokens_already_cached_do_not_defer():
    s = make(num_pages=128, page_size=1)
    base = tokens(1000, 40)
    s.prefill.add(pending(9, base + [7], max_tokens=1))
    batch = s.schedule()
    s.run(batch)
    s.finish(batch.reqs[0])  # base is cached now
    for i, tail in enumerate(([1, 2], [3, 4])):
        s.prefill.add(pending(i, base + tail, max_tokens=2))
    assert [(r.uid, r.cached_len) for r in s.schedule().reqs] == [(0, 40), (1, 40)]


# --- chunking -------------------------------------------------------------------------------------

def test_prompt_longer_than_the_budget_is_cut_and_stays_at_the_queue_head():
    s = make(num_pages=64, page_size=4, max_prefill_length=8)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=3))
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=3))
    batch = s.schedule()
    (chunk,) = batch.reqs
    assert isinstance(chunk, ChunkedReq) and not chunk.can_decode
    assert (chunk.cached_len, chunk.device_len) == (0, 8)
    assert [p.uid for p in s.prefill.pending] == [0, 1] and s.prefill.pending[0].chunk is chunk


def test_chunks_continue_where_the_last_stopped_and_the_rest_follows():
    s = make(num_pages=64, page_size=4, max_prefill_length=8)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=3))
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=3))
    spans = []
    while s.prefill.pending:
        batch = s.schedule()
        spans.append([(r.uid, r.cached_len, r.device_len, type(r).__name__) for r in batch.reqs])
        s.run(batch)
        s.cache.check_integrity(s.running())
    assert spans == [[(0, 0, 8, "ChunkedReq")], [(0, 8, 16, "ChunkedReq")],
                     [(0, 16, 20, "Req"), (1, 0, 3, "Req")]]
    rows = {r.table_idx for r in s.decode.running}
    assert len(rows) == 2  # the chunks kept one row


def test_chunk_token_ids_are_written_to_the_token_pool():
    s = make(num_pages=64, page_size=4, max_prefill_length=8)
    s.prefill.add(pending(0, tokens(300, 12), max_tokens=2))
    (chunk,) = s.schedule().reqs
    assert s.table.token_pool[chunk.table_idx, :8].tolist() == tokens(300, 8)
    assert s.table.token_pool[chunk.table_idx, 8:12].tolist() == [0] * 4  # not yet


def test_continuing_chunk_reserves_its_remaining_pages_before_later_requests():
    s = make(num_pages=13, page_size=1, max_prefill_length=10)
    s.prefill.add(pending(0, tokens(0, 12), max_tokens=1))  # 12 pages over its life
    s.prefill.add(pending(1, tokens(100, 2), max_tokens=1))  # 2 pages
    s.run(s.schedule())  # the first 10 tokens
    assert len(s.cache.free_pages) == 3  # 3 free, but 2 of them are the chunk's
    batch = s.schedule()
    assert [r.uid for r in batch.reqs] == [0] and not isinstance(batch.reqs[0], ChunkedReq)
    assert [p.uid for p in s.prefill.pending] == [1]


def test_budget_spent_exactly_admits_nothing_more():
    s = make(num_pages=64, page_size=1, max_prefill_length=5)
    s.prefill.add(pending(0, tokens(0, 5), max_tokens=2))
    s.prefill.add(pending(1, tokens(100, 2), max_tokens=2))
    batch = s.schedule()
    assert [(r.uid, type(r)) for r in batch.reqs] == [(0, Req)]
    assert [p.uid for p in s.prefill.pending] == [1]


# --- cache_req ------------------------------------------------------------------------------------

def test_cache_req_frees_duplicate_pages_and_switches_to_the_cached_copy():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=4))
    s.prefill.add(pending(1, tokens(0, 10), max_tokens=4))  # shares 9 < 32: same batch
    batch = s.schedule()
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


def test_cache_req_of_a_finished_request_frees_its_unaligned_tail():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=1))
    batch = s.schedule()
    (req,) = batch.reqs
    s.cache.allocate([req])
    req.complete_one()
    s.cache.cache_req(req, finished=False)  # 8 of 10 tokens cached, the tail page is held
    assert len(s.cache.free_pages) == 13 and s.cache.held_pages([req]) == 1
    tail_page = int(s.cache.page_table[req.table_idx, 8]) // 4
    s.cache.cache_req(req, finished=True)
    assert len(s.cache.free_pages) == 14 and tail_page in s.cache.free_pages
    assert (s.cache.prefix_cache.evictable_size, s.cache.prefix_cache.protected_size) == (8, 0)
    assert s.cache.handles == {}
    s.cache.check_integrity([])


def test_cache_req_of_a_running_request_locks_its_new_prefix():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 13), max_tokens=3))
    req, = s.schedule().reqs
    s.cache.allocate([req])
    req.complete_one()
    s.cache.cache_req(req, finished=False)
    assert s.cache.handles[req].cached_len == 12
    assert (s.cache.prefix_cache.evictable_size, s.cache.prefix_cache.protected_size) == (0, 12)


def test_naive_cache_req_of_a_finished_request_frees_every_page():
    s = make(num_pages=16, page_size=4, cache_type="naive")
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=3))
    batch = s.schedule()
    s.run(batch)
    s.run(s.decode.schedule_next_batch())
    assert len(s.cache.free_pages) == 13
    s.finish(batch.reqs[0])
    assert sorted(s.cache.free_pages) == list(range(16))


def test_check_integrity_catches_a_lost_page():
    s = make(num_pages=16, page_size=4)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=3))
    s.run(s.schedule())
    s.cache.check_integrity(s.running())
    s.cache.free_pages.pop()
    with pytest.raises(AssertionError, match="16 pages"):
        s.cache.check_integrity(s.running())
