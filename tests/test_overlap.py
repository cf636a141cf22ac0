"""Chapter 11: overlap scheduling. step() launches batch i+1 before it reads batch i's tokens, so
each batch is reported one step late; outputs are identical with overlap on and off; a request
that reached max_tokens or met EOS is not computed again and is freed exactly once, after the
batch in flight no longer uses it; a prompt is shared with later requests as soon as its
prefill is launched; the token pool holds each request's tokens on the device. Randomized
workloads over everything the scheduler has (arrival order and steps, prompt lengths, shared
prefixes, page sizes, tight pools, chunked prefill, radix and naive caches, overlap on and off)
give each request exactly what it gives alone, leak no page or row, and keep the cache's
bookkeeping consistent after every step. LLM.generate is tested in test_llm.py, overlap on a
real GPU in test_overlap_gpu.py."""

from __future__ import annotations

import random
import re

import pytest
import torch

from conftest import SMOLLM2, TINY_QWEN3
from minisgl.core import Req, SamplingParams
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.table import TableManager
from scheduler_helpers import (REF_TOKENS, Arrival, RandomRunChecks,
                               admit_behind_a_cached_prefix,
                               assert_eos_frees_a_request_exactly_once, completed_runs, drive,
                               eos_case,
                               greedy, make_scheduler, pending, random_ids, record_batches,
                               reference, small_pool, tokens)

CHAPTER = 11  # tools/steps.py check runs this module on chapter 11's own tree


# --- randomized runs ------------------------------------------------------------------------------

SEEDS = list(range(12))  # every page size with overlap on and off, naive with four page sizes


@pytest.mark.parametrize("seed", SEEDS)
class TestRandomRun(RandomRunChecks):
    chapter = CHAPTER

    def assert_no_leak(self, run):
        assert run.scheduler.in_flight is None and not run.scheduler.finished
        super().assert_no_leak(run)


def test_random_workloads_cover_waiting_chunking_hits_and_eviction():
    """The seeds above really exercise what they are meant to: among the runs that completed,
    some queued requests behind a full pool, chunked a prompt, hit the radix cache (with
    overlap on and off) and evicted from it."""
    done = completed_runs(SEEDS, CHAPTER)
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


def test_overlap_on_and_off_give_identical_outputs():
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


def test_overlap_off_reports_each_batch_in_its_own_step():
    s = make_scheduler(TINY_QWEN3, overlap=False)
    s.add_request(0, [5, 6, 7], greedy(3))
    assert [(o.uid, o.finished) for o in s.step()] == [(0, False)]


def test_a_request_that_reached_max_tokens_is_not_decoded_again_with_overlap(monkeypatch):
    # prompt 3 + 3 tokens: one prefill and two decodes; the 3rd token never runs, although the
    # host reads it only after the next step has been scheduled
    s = make_scheduler(TINY_QWEN3, overlap=True)
    log = record_batches(s, monkeypatch)
    drive(s, [Arrival(0, 0, [5, 6, 7], 3)])
    assert [r.reqs for r in log] == [[(0, 0, 3, "Req")], [(0, 3, 4, "Req")], [(0, 4, 5, "Req")]]


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


def test_radix_cache_shares_a_prefix_as_soon_as_its_prefill_is_launched():
    # As in chapter 9, but with overlap: the second and third requests wait one step and hit
    # the cache, although the first one's token has not been read when they are admitted.
    rng = random.Random(6)
    base = random_ids(rng, 40)
    prompts = [base + random_ids(rng, 3) for _ in range(3)]
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, overlap=True)
    outputs = drive(s, [Arrival(0, i, p, 5) for i, p in enumerate(prompts)])
    assert [[o.token for o in outputs[i]] for i in range(3)] == \
        [reference(TINY_QWEN3, p)[:5] for p in prompts]
    assert s.prefill_computed_tokens == 43 + 2 * 3
    assert s.cache.hit_tokens == 2 * 40


def test_running_requests_take_a_token_in_every_step_of_a_long_prompt_with_overlap(
        monkeypatch):
    # With overlap the running request's input is the token of the batch still in flight: the
    # mixed batch reads it from the device's token pool, as a decode batch does.
    rng = random.Random(3)
    short, long = random_ids(rng, 5), random_ids(rng, 30)
    s = make_scheduler(TINY_QWEN3, page_size=4, num_page_override=64, max_prefill_length=8,
                       overlap=True)
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, short, 20), Arrival(1, 1, long, 3)])
    chunk_steps = [i for i, r in enumerate(log) if r.chunked]
    assert len(chunk_steps) == 3  # 30 tokens in chunks of 8: 3 chunks, then the last 6
    assert all(log[i].phase == "prefill" and 0 in log[i].uids for i in chunk_steps), log
    assert [i for i, r in enumerate(log) if 0 in r.uids] == list(range(20))
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, short)
    assert [o.token for o in outputs[1]] == reference(TINY_QWEN3, long)[:3]


def test_decode_manager_keeps_a_request_once_and_removing_it_twice_is_harmless():
    # With overlap a request joins when its prefill is launched and may be removed both when it
    # reaches max_tokens at launch and when its EOS reaches the host.
    decode = DecodeManager(1)
    a, b = (Req(torch.arange(n, dtype=torch.int32), table_idx=0, cached_len=0, output_len=3,
                uid=0, sampling_params=SamplingParams(max_tokens=3)) for n in (2, 4))
    decode.add(b)
    decode.add(a)
    decode.add(b)  # already there: no duplicate
    batch = decode.schedule_next_batch()
    assert batch.is_decode and batch.reqs == [b, a]
    decode.remove(b)
    decode.remove(b)  # removing twice is harmless
    assert decode.schedule_next_batch().reqs == [a]


# --- the token pool -------------------------------------------------------------------------------

def test_table_rows_are_allocated_and_freed_next_to_a_token_pool():
    table = TableManager(torch.zeros(3, 8, dtype=torch.int32))
    assert table.available == 3 and table.token_pool.shape == (3, 8)
    rows = {table.allocate(), table.allocate()}
    assert table.available == 1 and len(rows) == 2
    table.free(rows.pop())
    assert table.available == 2


def test_admission_writes_the_uncached_prompt_into_the_token_pool():
    s = small_pool(num_pages=16, page_size=4)
    req = admit_behind_a_cached_prefix(s)
    assert req.cached_len == 8
    assert s.table.token_pool[req.table_idx, 8:10].tolist() == [500, 501]


def test_chunk_token_ids_are_written_to_the_token_pool():
    s = small_pool(num_pages=64, page_size=4, max_prefill_length=8)
    s.prefill.add(pending(0, tokens(300, 12), max_tokens=2))
    (chunk,) = s.prefill.schedule_next_batch().reqs
    assert s.table.token_pool[chunk.table_idx, :8].tolist() == tokens(300, 8)
    assert s.table.token_pool[chunk.table_idx, 8:12].tolist() == [0] * 4  # not yet


# --- EOS ------------------------------------------------------------------------------------------

def test_eos_ends_a_request_at_the_eos_token_with_overlap(monkeypatch):
    ids, eos, k = eos_case(TINY_QWEN3, seed=1)
    s = make_scheduler(TINY_QWEN3, overlap=True, page_size=4, num_page_override=32)
    s.eos_token_ids = frozenset({eos})
    log = record_batches(s, monkeypatch)
    outputs = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], ignore_eos=False)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)[: k + 1]
    assert [o.finished for o in outputs[0]] == [False] * k + [True]
    # The next decode was already launched when the EOS reached the host: that step ran (one
    # batch more than serial) and its token was dropped above.
    assert len(log) == k + 2


def test_ignore_eos_runs_past_the_eos_token_with_overlap():
    ids, eos, k = eos_case(TINY_QWEN3, seed=1)
    s = make_scheduler(TINY_QWEN3, overlap=True)
    s.eos_token_ids = frozenset({eos})
    outputs = drive(s, [Arrival(0, 0, ids, REF_TOKENS)], ignore_eos=True)
    assert [o.token for o in outputs[0]] == reference(TINY_QWEN3, ids)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_eos_frees_a_request_exactly_once_while_others_run_on(overlap, monkeypatch):
    # With the radix cache (chapter 7 runs this without one, serially).
    assert_eos_frees_a_request_exactly_once(monkeypatch, overlap=overlap)


# --- the chapter's example ---

import ast  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_generates_the_same_with_overlap_on_and_off(hf_model, hf_tokenizer, hf_greedy):
    out = run_example("ch11_overlap.py")
    blocks = re.split(r"^overlap=(?:True|False)（[\d.]+ 秒）$", out, flags=re.M)
    assert blocks[0] == "" and len(blocks) == 3
    assert out.index("overlap=True") < out.index("overlap=False")
    rows = [[(ast.literal_eval(text), ast.literal_eval(ids))
             for text, ids in re.findall(r"^  (['\"].*['\"]) (\[.*\])$", block, re.M)]
            for block in blocks[1:]]
    assert rows[0] == rows[1]  # overlap changes no token, sampled ones included
    (greedy_text, greedy_ids), (sampled_text, sampled_ids) = rows[0]
    tokenizer, hf = hf_tokenizer(SMOLLM2), hf_model(SMOLLM2)
    prompt = tokenizer("The capital of France is").input_ids
    want = hf_greedy(hf, prompt, 10)
    assert hf.generation_config.eos_token_id not in want  # so the greedy request has all 10
    assert greedy_ids == want and greedy_text == tokenizer.decode(want)
    # The sampled request (temperature 0.7, top_k 20): each token among HF's 20 likeliest there.
    ids = [504, 3575, 282, 8295, 314]
    assert 1 <= len(sampled_ids) <= 10 and sampled_text == tokenizer.decode(sampled_ids)
    for token in sampled_ids:
        logits = hf(torch.tensor([ids])).logits[0, -1]
        assert token in logits.topk(20).indices.tolist()
        ids.append(token)
    n = len(tokenizer("x" * 3000).input_ids)
    message = f"ValueError: prompt has {n:,} tokens and asks for up to 8 more; max_seq_len is 256"
    assert out.count(message) == 2
