"""Chapter 7: continuous batching. scheduler.Scheduler on the tiny random models, as chapter 7 has
it: a new request is prefilled as soon as a page-table row is free, running requests decode
together, and each leaves when it has its max_tokens while the others carry on. Randomized
workloads (arrival steps, prompt lengths, page sizes, rows) give each request exactly what it
gives alone and leak no page or row; plus joining and leaving, waiting for a row, EOS, request
rejection and the chapter's example. The tests of later chapters' scheduling live in their own
modules (test_admission, test_radix_scheduler, test_chunked_prefill, test_overlap)."""

from __future__ import annotations

import random
import re

import pytest

from conftest import SMOLLM2, TINY_LLAMA, TINY_QWEN3
from scheduler_helpers import (MIXED_BATCHES, NO_PREFIX_SHARING, REF_TOKENS, Arrival,
                               RandomRunChecks, assert_eos_frees_a_request_exactly_once,
                               completed_runs,
                               drive, eos_case, greedy, make_scheduler, random_ids,
                               record_batches, reference)

CHAPTER = 7  # tools/steps.py check runs this module on chapter 7's own tree


def scheduler(**options):
    """Chapter 7's scheduler on tiny-qwen3: no prefix sharing on later trees either."""
    return make_scheduler(TINY_QWEN3, **NO_PREFIX_SHARING, **options)


# --- randomized runs ------------------------------------------------------------------------------

SEEDS = [0, 1, 6, 7]  # page sizes 1, 2, 4, 16; tiny-qwen3 twice, tiny-llama twice


@pytest.mark.parametrize("seed", SEEDS)
class TestRandomRun(RandomRunChecks):
    chapter = CHAPTER


def test_random_workloads_cover_waiting_for_a_row_and_shared_batches():
    """The seeds above really exercise what they are meant to: among the runs that completed,
    some queued a request behind full rows and some ran several requests in one batch."""
    done = completed_runs(SEEDS, CHAPTER)
    assert [seed for seed, run in done.items() if run.stats["waited"] > 0]
    assert [seed for seed, run in done.items() if run.stats["batched"] > 0]


def test_scheduler_reference_equals_hf_greedy(hf_model, hf_greedy):
    """The one-at-a-time reference the randomized runs compare against is itself right."""
    rng = random.Random(9)
    for model in (TINY_QWEN3, TINY_LLAMA):
        ids = random_ids(rng, 17)
        assert reference(model, ids) == hf_greedy(hf_model(model), ids, REF_TOKENS), model


# --- joining and leaving --------------------------------------------------------------------------

def test_a_new_request_is_prefilled_first_then_joins_the_decode_batch(monkeypatch):
    s = scheduler(max_running_req=4, page_size=4, num_page_override=32)
    log = record_batches(s, monkeypatch)
    a, b = random_ids(random.Random(1), 5), random_ids(random.Random(2), 7)
    outputs = drive(s, [Arrival(0, 0, a, 4), Arrival(2, 1, b, 5)])
    if not MIXED_BATCHES:
        assert [(r.phase, r.reqs) for r in log] == [
            ("prefill", [(0, 0, 5, "Req")]),
            ("decode", [(0, 5, 6, "Req")]),
            ("prefill", [(1, 0, 7, "Req")]),  # it arrived at step 2: its prompt first
            ("decode", [(0, 6, 7, "Req"), (1, 7, 8, "Req")]),
            ("decode", [(0, 7, 8, "Req"), (1, 8, 9, "Req")]),  # request 0 has its 4 tokens
            ("decode", [(1, 9, 10, "Req")]),  # request 1 carries on alone
            ("decode", [(1, 10, 11, "Req")]),
        ]
    else:  # request 0 rides in request 1's prefill step
        assert [(r.phase, r.reqs) for r in log] == [
            ("prefill", [(0, 0, 5, "Req")]),
            ("decode", [(0, 5, 6, "Req")]),
            ("prefill", [(0, 6, 7, "Req"), (1, 0, 7, "Req")]),
            ("decode", [(0, 7, 8, "Req"), (1, 7, 8, "Req")]),  # request 0 has its 4 tokens
            ("decode", [(1, 8, 9, "Req")]),  # request 1 carries on alone
            ("decode", [(1, 9, 10, "Req")]),
            ("decode", [(1, 10, 11, "Req")]),
        ]
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, a)[:4]
    assert [o.token for o in outputs[1]] == reference(TINY_QWEN3, b)[:5]


def test_a_request_waits_for_a_free_row():
    s = scheduler(max_running_req=1, page_size=4, num_page_override=32)
    a, b = random_ids(random.Random(3), 6), random_ids(random.Random(4), 6)
    s.add_request(0, a, greedy(3))
    s.add_request(1, b, greedy(2))
    reports = []
    while s.has_work:
        reports.append([(o.uid, o.finished) for o in s.step()])
        assert len(s.prefill.pending) == (1 if len(reports) <= 3 else 0)  # B waits 3 steps
    assert reports == [[(0, False)], [(0, False)], [(0, True)], [(1, False)], [(1, True)]]


def test_a_request_that_reached_max_tokens_is_not_decoded_again(monkeypatch):
    # prompt 3 + 3 tokens: one prefill and two decodes; the 3rd token never runs
    s = scheduler()
    log = record_batches(s, monkeypatch)
    drive(s, [Arrival(0, 0, [5, 6, 7], 3)])
    assert [r.reqs for r in log] == [[(0, 0, 3, "Req")], [(0, 3, 4, "Req")], [(0, 4, 5, "Req")]]


def test_each_step_reports_the_tokens_of_its_own_batch():
    s = scheduler()
    s.add_request(0, [5, 6, 7], greedy(3))
    assert [(o.uid, o.finished) for o in s.step()] == [(0, False)]


def test_table_rows_are_allocated_and_freed():
    table = scheduler(max_running_req=3).table
    assert table.available == 3
    rows = {table.allocate(), table.allocate()}
    assert table.available == 1 and len(rows) == 2
    table.free(rows.pop())
    assert table.available == 2


# --- EOS ------------------------------------------------------------------------------------------

def test_eos_ends_a_request_at_the_eos_token(monkeypatch):
    ids, eos, k = eos_case(TINY_QWEN3, seed=1)
    s = scheduler(page_size=4, num_page_override=32)
    s.eos_token_ids = frozenset({eos})
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], ignore_eos=False)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)[: k + 1]
    assert [o.finished for o in outputs[0]] == [False] * k + [True]
    assert len(log) == k + 1  # no step runs after the one that sampled the EOS token


def test_ignore_eos_runs_past_the_eos_token():
    ids, eos, k = eos_case(TINY_QWEN3, seed=1)
    s = scheduler()
    s.eos_token_ids = frozenset({eos})
    outputs = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], ignore_eos=True)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)


def test_eos_frees_a_request_exactly_once_while_others_run_on(monkeypatch):
    assert_eos_frees_a_request_exactly_once(monkeypatch, **NO_PREFIX_SHARING)


# --- rejection ------------------------------------------------------------------------------------

def test_add_request_rejects_an_empty_prompt_without_queueing():
    s = scheduler()
    with pytest.raises(ValueError, match="empty"):
        s.add_request(0, [], greedy(4))
    assert not s.has_work and not s.prefill.pending


def test_add_request_rejects_a_too_long_prompt_naming_the_lengths():
    s = scheduler(max_seq_len_override=50)
    with pytest.raises(ValueError) as info:
        s.add_request(0, list(range(3, 48)), greedy(6))
    message = str(info.value)
    assert all(re.search(rf"\b{n}\b", message) for n in (45, 6, 50)), message
    assert not s.has_work and not s.prefill.pending


def test_add_request_accepts_a_request_of_exactly_max_seq_len():
    s = scheduler(max_seq_len_override=50)
    s.add_request(0, list(range(3, 47)), greedy(6))
    assert len(s.prefill.pending) == 1


# --- the chapter's example ---

import ast  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_shows_requests_joining_and_leaving(hf_model, hf_tokenizer, hf_greedy):
    out = run_example("ch07_continuous_batching.py")
    # Two rows; A (3 tokens) and B (5) arrive at step 0, C (2) at step 2, D (2) at step 4. A row
    # frees when a request has its last token; a waiting request is prefilled in the next step.
    # From chapter 10 on, B rides in C's prefill step: it finishes a step earlier.
    assert re.findall(r"^第 \d+ 步：.*$", out, re.M) == [
        "第 0 步：A、B；排队 0 个",
        "第 1 步：A、B；排队 0 个",
        "第 2 步：A（完成）、B；排队 1 个",  # C waits: both rows are taken
        "第 3 步：B、C；排队 0 个" if MIXED_BATCHES else "第 3 步：C；排队 0 个",
        "第 4 步：B（完成）、C（完成）；排队 1 个" if MIXED_BATCHES
        else "第 4 步：B、C（完成）；排队 1 个",  # D waits for C's row
        "第 5 步：D；排队 0 个",
        "第 6 步：D（完成）；排队 0 个" if MIXED_BATCHES else "第 6 步：B（完成）、D（完成）；排队 0 个",
    ]
    prompts = {"A": ("The capital of France is", 3), "B": ("def fibonacci(n):", 5),
               "C": ("The quick brown fox", 2), "D": ("Once upon a time", 2)}
    texts = {m[0]: ast.literal_eval(m[1]) for m in re.findall(r"^([ABCD])：(.*)$", out, re.M)}
    tokenizer, hf = hf_tokenizer(SMOLLM2), hf_model(SMOLLM2)
    assert texts == {name: tokenizer.decode(hf_greedy(hf, tokenizer(prompt).input_ids, n))
                     for name, (prompt, n) in prompts.items()}
