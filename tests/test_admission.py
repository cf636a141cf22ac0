"""Chapter 8: admission. What a request needs over its whole life (pages_for, total_tokens,
pages_to_finish, what running requests are still owed), when PrefillManager admits it (a free
row, and free pages that cover what running requests are owed plus its whole life), FIFO order,
and randomized workloads in pools that barely fit their largest request: requests wait for pages,
nothing admitted runs out of KV, each request gets what it gets alone, no page or row leaks.
The managers are a real scheduler's (tiny-qwen3), with chapter 9's prefix cache off."""

from __future__ import annotations

import random
import re

import pytest
import torch

from conftest import SMOLLM2, TINY_QWEN3
from minisgl.core import Req, SamplingParams
from minisgl.scheduler.cache import pages_for
from minisgl.scheduler.decode import DecodeManager, pages_to_finish
from scheduler_helpers import (NO_PREFIX_SHARING, Arrival, RandomRunChecks, completed_runs, drive,
                               pending, random_ids, record_adders, record_batches, reference,
                               small_pool, tokens)

CHAPTER = 8  # tools/steps.py check runs this module on chapter 8's own tree


def pool(num_pages: int, page_size: int, rows: int = 4):
    return small_pool(num_pages, page_size, rows, **NO_PREFIX_SHARING)


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
    batch = decode.schedule_next_batch()
    assert batch.is_decode and batch.reqs == [b, a]
    decode.remove(b)
    assert decode.schedule_next_batch().reqs == [a]


# --- admission by pages -------------------------------------------------------------------------

def test_request_whose_whole_life_fits_exactly_is_admitted(monkeypatch):
    s = pool(num_pages=5, page_size=4)
    adders = record_adders(monkeypatch)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=11))  # 20 tokens: 5 pages
    batch = s.prefill.schedule_next_batch()
    assert [r.uid for r in batch.reqs] == [0] and adders[-1].reserved_pages == 5
    assert s.table.available == 3


def test_request_one_token_over_the_pool_is_not_admitted(monkeypatch):
    s = pool(num_pages=5, page_size=4)
    adders = record_adders(monkeypatch)
    s.prefill.add(pending(0, tokens(0, 10), max_tokens=12))  # 21 tokens
    assert s.prefill.schedule_next_batch() is None
    assert adders[-1].reserved_pages == 0 and s.table.available == 4
    assert [p.uid for p in s.prefill.pending] == [0]


def test_admission_leaves_room_for_what_running_requests_are_owed():
    s = pool(num_pages=5, page_size=4)
    s.prefill.add(pending(0, tokens(0, 4), max_tokens=9))  # 12 tokens: 3 pages
    s.step()  # its prefill: 1 page now, 2 owed
    assert len(s.cache.free_pages) == 4 and s.decode.reserved_pages == 2
    s.prefill.add(pending(1, tokens(100, 7), max_tokens=2))  # 2 pages
    assert [r.uid for r in s.prefill.schedule_next_batch().reqs] == [1]
    s.prefill.add(pending(2, tokens(200, 8), max_tokens=3))  # 3 pages
    assert s.prefill.schedule_next_batch() is None


def test_first_request_that_does_not_fit_blocks_those_behind_it():
    s = pool(num_pages=4, page_size=4)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=1))  # 5 pages: never now
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=1))  # 1 page: would fit
    assert s.prefill.schedule_next_batch() is None
    assert [p.uid for p in s.prefill.pending] == [0, 1]
    assert s.table.available == 4 and len(s.cache.free_pages) == 4


def test_requests_are_admitted_in_arrival_order_until_one_does_not_fit():
    s = pool(num_pages=4, page_size=4)
    s.prefill.add(pending(0, tokens(0, 3), max_tokens=2))  # 1 page
    s.prefill.add(pending(1, tokens(100, 16), max_tokens=2))  # 5 pages: not now
    s.prefill.add(pending(2, tokens(200, 3), max_tokens=2))  # 1 page, but behind uid 1
    batch = s.prefill.schedule_next_batch()
    assert [r.uid for r in batch.reqs] == [0]
    assert [p.uid for p in s.prefill.pending] == [1, 2]


def test_no_free_row_admits_nothing():
    s = pool(num_pages=64, page_size=1, rows=1)
    s.prefill.add(pending(0, tokens(0, 3), max_tokens=4))
    s.step()
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=4))
    assert s.table.available == 0
    assert s.prefill.schedule_next_batch() is None and len(s.prefill.pending) == 1


def test_a_request_waits_with_a_row_free_until_a_running_one_returns_its_pages(monkeypatch):
    s = pool(num_pages=6, page_size=4)
    log = record_batches(s, monkeypatch)
    a, b = random_ids(random.Random(1), 8), random_ids(random.Random(2), 8)
    # a: 8 + 9 - 1 = 16 tokens, 4 pages; b: 8 + 5 - 1 = 12 tokens, 3 pages; 4 + 3 > 6
    outputs = drive(s, [Arrival(0, 0, a, 9), Arrival(0, 1, b, 5)])
    assert [(r.phase, r.uids) for r in log] == \
        [("prefill", [0])] + [("decode", [0])] * 8 + [("prefill", [1])] + [("decode", [1])] * 4
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, a)[:9]
    assert [o.token for o in outputs[1]] == reference(TINY_QWEN3, b)[:5]


# --- randomized runs in tight pools ---------------------------------------------------------------

SEEDS = [0, 1, 6, 7]  # page sizes 1, 2, 4, 16; tiny-qwen3 twice, tiny-llama twice


@pytest.mark.parametrize("seed", SEEDS)
class TestRandomRun(RandomRunChecks):
    chapter = CHAPTER


def test_random_workloads_make_requests_wait_for_pages():
    """Among the runs that completed, some left a request waiting while a row was free: the pool
    is what held it back. That nothing admitted ran out of pages is the runs themselves (the
    cache manager raises when it cannot give a request its slots)."""
    done = completed_runs(SEEDS, CHAPTER)
    assert [seed for seed, run in done.items() if run.stats["waited_for_pages"] > 0]


# --- the chapter's example ---

import ast  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_admits_two_requests_at_a_time(hf_model, hf_greedy):
    out = run_example("ch08_admission.py")
    # Each request: 12 prompt tokens, 10 outputs, so 12 + 10 - 1 = 21 tokens with K/V, 6 pages
    # of 4; the pool has 12: two run at a time, each for 10 steps (a prefill, 9 decodes).
    expected = []
    for step in range(30):
        wave, k = divmod(step, 10)
        uids = [[0, 1], [2, 3], [4]][wave]
        waiting = [3, 1, 0][wave]
        holding = -(-(12 + k) // 4)  # pages of the tokens [0, 12 + k) each has computed
        held, owed = (0, 0) if k == 9 else (len(uids) * holding, len(uids) * (6 - holding))
        expected.append(f"第 {step:2d} 步：算了 {uids}，排队 {waiting}；"
                        f"在跑的请求已占 {held} 页、还要 {owed} 页")
    assert re.findall(r"^第 .*$", out, re.M) == expected
    outputs = {int(uid): ast.literal_eval(ids)
               for uid, ids in re.findall(r"^请求 (\d)：(\[.*\])$", out, re.M)}
    hf = hf_model(SMOLLM2)
    assert outputs == {uid: hf_greedy(hf, list(range(1000 + 20 * uid, 1012 + 20 * uid)), 10)
                       for uid in range(5)}
