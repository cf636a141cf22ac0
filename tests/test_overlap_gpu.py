"""Overlap scheduling on a real GPU: the host runs one step ahead of the device, so every read
of device state must be ordered after the write it depends on. Skipped without CUDA.

Two streams can be late. The engine's (the forward) is slowed after each batch, so the next
step's host work runs while the device is still busy. The scheduler's (page table, positions,
KV write locations, attention metadata) is made to write each step's inputs late: zeros first,
the real values only after a sleep; a forward that did not wait for that stream would read the
zeros. Neither delay may change a single token.

The workload has what makes bookkeeping go wrong: prompts sharing prefixes (radix cache hits,
one prompt entirely cached), a prompt longer than the prefill budget (chunked prefill), requests
that stop at an EOS token, an abort in mid-decode (from chapter 14, where Scheduler.abort
arrives), and a KV pool too small to keep every finished prefix (eviction). The reference is
transformers' greedy decoding in float32 on the same GPU, each prompt alone.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.engine import Engine
from minisgl.scheduler import Scheduler, SchedulerConfig

CHAPTER = 11  # tools/steps.py check runs this module on chapter 11's own tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CAN_ABORT = hasattr(Scheduler, "abort")  # chapter 14 on
ABORTED, ABORT_AFTER = 2, 3  # request 2 is aborted once it has reported 3 tokens
# serve() and the reference also run on "cpu" (streams are no-ops there): to try a workload.
DEVICE = "cuda"
PAGE_SIZE, NUM_PAGES, ROWS, PREFILL_BUDGET = 4, 24, 4, 16


@dataclass
class Request:
    uid: int
    arrival: int  # the step before which it is added
    ids: list[int]
    max_tokens: int
    ignore_eos: bool


def workload() -> list[Request]:
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, 49152) for _ in range(n)]

    shared = ids(24)
    first = shared + ids(6)
    return [
        Request(0, 0, first, 10, True),
        Request(1, 0, ids(45), 8, True),  # 45 > 16 tokens a prefill: three chunks
        Request(2, 0, ids(12), 16, True),  # aborted after its third token (chapter 14 on)
        Request(3, 8, shared[:20] + ids(5), 12, False),  # hits 20 cached tokens; may stop at EOS
        Request(4, 8, shared + ids(10), 12, False),
        Request(5, 16, first, 6, True),  # request 0's prompt again: all but its last token cached
        Request(6, 20, ids(40), 10, False),
        Request(7, 24, ids(30), 8, True),
    ]


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens, recomputing the whole sequence each step (no KV cache to get wrong)."""
    seq = torch.tensor([ids], device=DEVICE)
    for _ in range(n):
        next_token = model(seq).logits[0, -1].argmax()
        seq = torch.cat([seq, next_token.view(1, 1)], dim=1)
    return seq[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def case(tiny_llama_path, tmp_path_factory) -> tuple[Path, dict[int, list[int]], int]:
    """The model directory to serve (tiny-llama with an EOS token that the workload meets),
    each request's expected tokens, and that EOS token."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32)
    hf = hf.to(DEVICE).eval()
    with torch.no_grad():
        full = {r.uid: hf_greedy(hf, r.ids, r.max_tokens) for r in workload()}
    del hf
    # EOS: a token that a request which honours EOS produces for the first time at its third
    # output or later (and before its last), so that it stops early, after a few decode steps.
    eos = next((ref[k] for ref in (full[r.uid] for r in workload() if not r.ignore_eos)
                for k in range(2, len(ref) - 1) if ref[k] not in ref[:k]), None)
    if eos is None:
        pytest.fail("no request meets a new token after its second one: change the workload")
    expected = {}
    for r in workload():
        tokens = full[r.uid]
        if not r.ignore_eos and eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]  # the EOS token is output, then it stops
        if CAN_ABORT and r.uid == ABORTED:
            tokens = tokens[:ABORT_AFTER]
        expected[r.uid] = tokens
    assert any(len(expected[r.uid]) < r.max_tokens for r in workload() if not r.ignore_eos)
    # The same checkpoint, but generation_config.json names `eos` as the EOS token.
    model_dir = tmp_path_factory.mktemp("tiny-llama-eos")
    for f in tiny_llama_path.iterdir():
        if f.name != "generation_config.json":
            (model_dir / f.name).symlink_to(f.resolve())
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    return model_dir, expected, eos


def slow_streams(monkeypatch, cycles: int) -> None:
    """Make both streams late by `cycles` GPU clock cycles per step."""
    if not hasattr(Scheduler, "_prepare"):  # chapter 18 on: the engine prepares and launches
        real_launch = Scheduler._launch

        def slow_launch(scheduler, batch):
            engine = scheduler.engine
            # Everything this step's preparation copies to the device lands late...
            with torch.cuda.stream(engine.prepare_stream):
                torch.cuda._sleep(cycles)
            launched = real_launch(scheduler, batch)
            # ...and the device is still busy when the host moves on.
            with torch.cuda.stream(engine.stream):
                torch.cuda._sleep(cycles)
            return launched

        monkeypatch.setattr(Scheduler, "_launch", slow_launch)
        return
    real_forward, real_prepare = Engine.forward_batch, Scheduler._prepare

    def slow_forward(engine, batch, args):
        output = real_forward(engine, batch, args)
        with torch.cuda.stream(engine.stream):
            torch.cuda._sleep(cycles)  # the device is still busy when the host moves on
        return output

    def late_prepare(scheduler, batch):
        # step() runs this on the scheduler's stream. Every tensor the forward reads from this
        # step's preparation is replaced by a copy written there: zeros now, values after the
        # sleep. (The host's own copies are synchronous, so without this the stream would be
        # idle by the time the forward is launched and a missing wait would go unseen.)
        rows = real_prepare(scheduler, batch)
        meta = batch.attn_metadata
        names = [n for n, v in vars(meta).items() if isinstance(v, torch.Tensor)]
        now = [rows, batch.positions, batch.out_loc] + [getattr(meta, n) for n in names]
        late = [torch.zeros_like(t) for t in now]
        torch.cuda._sleep(cycles)
        for copy, t in zip(late, now):
            copy.copy_(t)
        rows, batch.positions, batch.out_loc = late[:3]
        for name, t in zip(names, late[3:]):
            setattr(meta, name, t)
        return rows

    monkeypatch.setattr(Engine, "forward_batch", slow_forward)
    monkeypatch.setattr(Scheduler, "_prepare", late_prepare)


def serve(model_dir: Path, overlap: bool) -> tuple[dict[int, list[tuple[int, bool]]], dict]:
    """Run the workload; each request's (token, finished) outputs, and what happened on the way."""
    scheduler = Scheduler(SchedulerConfig(
        str(model_dir), dtype=torch.float32, device=DEVICE, max_running_req=ROWS,
        page_size=PAGE_SIZE, num_page_override=NUM_PAGES, max_seq_len_override=128,
        cache_type="radix", max_prefill_length=PREFILL_BUDGET, overlap=overlap))
    try:
        requests = sorted(workload(), key=lambda r: r.arrival)
        outputs: dict[int, list[tuple[int, bool]]] = {r.uid: [] for r in requests}
        seen = {"chunked": 0, "aborted": False}
        step = 0
        while requests or scheduler.has_work:
            while requests and requests[0].arrival <= step:
                r = requests.pop(0)
                scheduler.add_request(r.uid, r.ids, SamplingParams(
                    max_tokens=r.max_tokens, ignore_eos=r.ignore_eos))
            for out in scheduler.step():
                outputs[out.uid].append((out.token, out.finished))
                if CAN_ABORT and out.uid == ABORTED and len(outputs[ABORTED]) == ABORT_AFTER:
                    assert scheduler.abort(ABORTED)
                    seen["aborted"] = True
            pending = scheduler.prefill.pending  # a prompt cut in this step waits at the head
            seen["chunked"] += bool(pending and pending[0].chunk is not None)
            step += 1
            assert step < 1000, "no progress"
        # Every page and row came back: free, or (radix) cached and unlocked.
        cache = scheduler.cache
        cache.check_integrity([])
        assert cache.prefix_cache.protected_size == 0 and cache.handles == {}
        assert sorted(scheduler.table.free_rows) == list(range(ROWS))
        seen.update(hit_tokens=cache.hit_tokens, evicted_pages=cache.evicted_pages)
        return outputs, seen
    finally:
        close = getattr(scheduler.engine, "close", None)
        if close is not None:
            close()


def check(outputs, seen, expected) -> None:
    for uid, want in expected.items():
        got = outputs[uid]
        assert [t for t, _ in got] == want, uid
        ended = CAN_ABORT and uid == ABORTED  # an aborted request reports no last token
        assert [f for _, f in got] == [False] * (len(want) - 1) + [not ended], uid
    # The workload did exercise what it is for.
    assert seen["chunked"] >= 2 and seen["hit_tokens"] > 0 and seen["evicted_pages"] > 0, seen
    assert seen["aborted"] == CAN_ABORT


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_workload_equals_transformers_greedy(case, overlap):
    model_dir, expected, _ = case
    check(*serve(model_dir, overlap), expected)


@pytest.mark.parametrize("cycles", [2_000_000, 50_000_000])
@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_slow_streams_do_not_change_a_token(case, overlap, cycles, monkeypatch):
    model_dir, expected, _ = case
    slow_streams(monkeypatch, cycles)
    check(*serve(model_dir, overlap), expected)
