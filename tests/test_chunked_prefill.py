"""Chapter 10: chunked prefill. A prompt longer than the token budget left is cut into chunks
(one that fits exactly is not) that stay at the head of the queue, keep their row and locked
prefix, and reserve their remaining pages before later requests; running requests ride in
every chunk's step (a mixed batch), each taking its token in every step, and chunks run back
to back; every prompt token is computed once (a running request's token is no prompt token);
the torch backend pads a mixed batch's one-token rows apart from its prompts; randomized
workloads with chunking (on top of chapter 9's caches and tight pools) give each request what
it gives alone and leak nothing."""

from __future__ import annotations

import random
import re

import pytest
import torch

from attention_helpers import Setup, dense_causal_reference
from conftest import SMOLLM2, TINY_QWEN3
from minisgl.core import Req
from minisgl.scheduler.prefill import ChunkedReq
from scheduler_helpers import (Arrival, RandomRunChecks, completed_runs, drive, held_requests,
                               make_scheduler, pending, random_ids, record_batches, reference,
                               small_pool, tokens)

CHAPTER = 10  # tools/steps.py check runs this module on chapter 10's own tree


# --- cutting prompts ------------------------------------------------------------------------------

def test_prompt_longer_than_the_budget_is_cut_and_stays_at_the_queue_head():
    s = small_pool(num_pages=64, page_size=4, max_prefill_length=8)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=3))
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=3))
    batch = s.prefill.schedule_next_batch()
    (chunk,) = batch.reqs
    assert isinstance(chunk, ChunkedReq) and chunk.can_decode is False
    assert (chunk.cached_len, chunk.device_len) == (0, 8)
    assert [p.uid for p in s.prefill.pending] == [0, 1] and s.prefill.pending[0].chunk is chunk


def test_chunks_continue_where_the_last_stopped_and_the_rest_follows(monkeypatch):
    s = small_pool(num_pages=64, page_size=4, max_prefill_length=8)
    log = record_batches(s, monkeypatch)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=3))
    s.prefill.add(pending(1, tokens(100, 3), max_tokens=3))
    while s.prefill.pending:
        s.step()
        s.cache.check_integrity(held_requests(s))
    assert [r.reqs for r in log] == [[(0, 0, 8, "ChunkedReq")], [(0, 8, 16, "ChunkedReq")],
                                     [(0, 16, 20, "Req"), (1, 0, 3, "Req")]]
    rows = {r.table_idx for r in s.decode.running}
    assert len(rows) == 2  # the chunks kept one row


def test_continuing_chunk_reserves_its_remaining_pages_before_later_requests():
    s = small_pool(num_pages=13, page_size=1, max_prefill_length=10)
    s.prefill.add(pending(0, tokens(0, 12), max_tokens=1))  # 12 pages over its life
    s.prefill.add(pending(1, tokens(100, 2), max_tokens=1))  # 2 pages
    s.step()  # the first 10 tokens
    assert len(s.cache.free_pages) == 3  # 3 free, but 2 of them are the chunk's
    batch = s.prefill.schedule_next_batch()
    assert [r.uid for r in batch.reqs] == [0] and not isinstance(batch.reqs[0], ChunkedReq)
    assert [p.uid for p in s.prefill.pending] == [1]


def test_request_fits_next_to_a_continuing_chunk_s_remaining_pages():
    s = small_pool(num_pages=14, page_size=1, max_prefill_length=10)
    s.prefill.add(pending(0, tokens(0, 12), max_tokens=1))  # 12 pages over its life
    s.prefill.add(pending(1, tokens(100, 2), max_tokens=1))  # 2 pages
    s.step()  # the first 10 tokens
    assert len(s.cache.free_pages) == 4  # 2 for the chunk's last 2 tokens, 2 left over
    assert [r.uid for r in s.prefill.schedule_next_batch().reqs] == [0, 1]


def test_a_prompt_that_fits_the_budget_exactly_is_not_cut():
    s = small_pool(num_pages=64, page_size=1, max_prefill_length=5)
    s.prefill.add(pending(0, tokens(0, 5), max_tokens=2))
    (req,) = s.prefill.schedule_next_batch().reqs
    assert type(req) is Req and (req.cached_len, req.device_len) == (0, 5)
    assert not s.prefill.pending


def test_the_next_prompt_gets_only_the_budget_left():
    s = small_pool(num_pages=64, page_size=1, max_prefill_length=8)
    s.prefill.add(pending(0, tokens(0, 5), max_tokens=2))
    s.prefill.add(pending(1, tokens(100, 10), max_tokens=2))
    batch = s.prefill.schedule_next_batch()
    assert [(r.uid, r.cached_len, r.device_len) for r in batch.reqs] == [(0, 0, 5), (1, 0, 3)]
    assert isinstance(batch.reqs[1], ChunkedReq)


def test_every_chunk_of_a_prompt_keeps_its_first_table_row(monkeypatch):
    s = small_pool(num_pages=64, page_size=4, rows=4, max_prefill_length=8)
    rows = []
    schedule = s.prefill.schedule_next_batch

    def watch():
        batch = schedule()
        rows.extend(r.table_idx for r in (batch.reqs if batch else []) if r.uid == 0)
        return batch

    monkeypatch.setattr(s.prefill, "schedule_next_batch", watch)
    s.prefill.add(pending(0, tokens(0, 20), max_tokens=3))  # chunks of 8, 8 and 4 tokens
    while s.prefill.pending:
        s.step()
    assert len(rows) == 3 and len(set(rows)) == 1
    assert s.table.available == 3  # it holds one row of the four


def test_budget_spent_exactly_admits_nothing_more():
    s = small_pool(num_pages=64, page_size=1, max_prefill_length=5)
    s.prefill.add(pending(0, tokens(0, 5), max_tokens=2))
    s.prefill.add(pending(1, tokens(100, 2), max_tokens=2))
    batch = s.prefill.schedule_next_batch()
    assert [(r.uid, type(r)) for r in batch.reqs] == [(0, Req)]
    assert [p.uid for p in s.prefill.pending] == [1]


# --- chunks and decode steps ----------------------------------------------------------------------

def test_running_requests_take_a_token_in_every_step_of_a_long_prompt(monkeypatch):
    rng = random.Random(3)
    short, long = random_ids(rng, 5), random_ids(rng, 30)
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, max_prefill_length=8)
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, short, 20), Arrival(1, 1, long, 3)])
    chunk_steps = [i for i, r in enumerate(log) if r.chunked]
    assert chunk_steps == [1, 2, 3]  # 30 tokens in chunks of 8, back to back; then the last 6
    for i in chunk_steps:  # request 0 rides along: one token on its cached prefix
        assert log[i].phase == "prefill" and log[i].reqs[0] == (0, 4 + i, 5 + i, "Req"), log
    # No step passes without request 0 until it finishes: 20 tokens in 20 steps.
    assert [i for i, r in enumerate(log) if 0 in r.uids] == list(range(20))
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, short)
    assert [o.token for o in outputs[1]] == reference(TINY_QWEN3, long)[:3]


def test_chunked_prefill_runs_chunks_back_to_back_when_nothing_decodes(monkeypatch):
    rng = random.Random(4)
    long = random_ids(rng, 30)
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, max_prefill_length=8)
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, long, 2)])
    assert [r.phase for r in log] == ["prefill"] * 4 + ["decode"]
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, long)[:2]


def test_chunked_prefill_computes_each_prompt_token_once():
    rng = random.Random(5)
    ids, other = random_ids(rng, 37), random_ids(rng, 3)
    s = make_scheduler(TINY_QWEN3, page_size=2, num_page_override=64, max_prefill_length=5)
    drive(s, [Arrival(0, 0, other, 12), Arrival(1, 1, ids, 4)])  # 0 decodes in 1's chunks
    assert s.prefill_computed_tokens == 3 + 37


# --- randomized runs ------------------------------------------------------------------------------

SEEDS = [1, 3, 6, 8]  # budgets of 6 to 31 tokens, page sizes 1 to 16; radix and naive; both models


@pytest.mark.parametrize("seed", SEEDS)
class TestRandomRun(RandomRunChecks):
    chapter = CHAPTER


def test_random_workloads_cover_chunking_with_hits():
    """Among the runs that completed, some cut a prompt into chunks, and some of those also hit
    the radix cache (a chunk continues from a matched prefix or is shared by a later request)."""
    done = completed_runs(SEEDS, CHAPTER)
    chunked = [seed for seed, run in done.items() if run.workload.config["max_prefill_length"]
               < max(len(a.ids) for a in run.workload.arrivals)]
    assert chunked
    assert [seed for seed in chunked if done[seed].scheduler.cache.hit_tokens > 0]


# --- the chapter's example ---

import ast  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_cuts_a_100_token_prompt_and_keeps_its_output(hf_model, hf_greedy):
    out = run_example("ch10_chunked_prefill.py")
    rows = re.findall(r"^max_prefill_length=\s*(\d+)：prefill 分 (\d+) 步算完，输出 (\[.*\])$",
                      out, re.M)
    # 100 prompt tokens in chunks of at most the budget: ceil(100 / budget) prefill steps.
    assert [(int(b), int(n)) for b, n, _ in rows] == [(8192, 1), (40, 3), (16, 7)]
    want = hf_greedy(hf_model(SMOLLM2), list(range(1000, 1100)), 6)
    assert [ast.literal_eval(tokens) for *_, tokens in rows] == [want] * 3


# --- the torch backend on a mixed batch -----------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 2, 3])
def test_torch_backend_pads_a_mixed_batch_s_decode_rows_apart_from_its_prompts(seed):
    setup = Setup(seed, page_size=4, q_per_kv=2, min_len=2)
    assert len(setup.seqs) >= 2
    # Every other request decodes one token on its cached prefix; the others are prompts.
    spans = [(s, s.length - 1, s.length) if i % 2 == 0 else (s, 0, s.length)
             for i, s in enumerate(setup.seqs)]
    setup.forward([(s, 0, cached) for s, cached, _ in spans if cached > 0])
    out, batch = setup.forward(spans)
    torch.testing.assert_close(out, dense_causal_reference(spans), atol=1e-5, rtol=1e-5)
    decode_rows, prompts = batch.attn_metadata.groups
    assert decode_rows.mask.shape[:3] == ((len(spans) + 1) // 2, 1, 1)
    assert prompts.mask.shape[0] == len(spans) // 2
