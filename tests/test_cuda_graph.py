"""CUDA graphs on the CPU through EmulatedGraph: graph replay gives the tokens of eager decode
(torch backend, and FlashInfer through the fake package), with and without overlap, with padding
and at TP=2; a runner that forgets to refill a static buffer is caught; and the capture sizes,
the reserved row and page (never handed out; a replay's padding rows touch nothing else), and
the configuration checks."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch

import fake_flashinfer
from conftest import SMOLLM2, TINY_QWEN3
from minisgl.attention import FlashAttentionBackend, FlashInferBackend, TorchAttentionBackend
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.engine.graph import GraphRunner, capture_batch_sizes
from minisgl.kvcache import MHAKVPool
from minisgl.layers import LMHead
from minisgl.llm import LLM
from scheduler_helpers import make_scheduler

CHAPTER = 18  # tools/steps.py check runs this module on chapter 18's own tree

PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The sun rises in the", "The capital of France is a city that"]


def generate(path, n_prompts: int = 4, max_tokens: int = 12, **options) -> list[list[int]]:
    llm = LLM(str(path), max_running_req=4, num_page_override=512, max_seq_len_override=96,
              **options)
    try:
        outs = llm.generate(PROMPTS[:n_prompts],
                            SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    finally:
        llm.shutdown()
    return [o["token_ids"] for o in outs]


def test_capture_sizes():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(4) == [1, 2, 4]
    assert capture_batch_sizes(6) == [1, 2, 4, 6]
    assert capture_batch_sizes(17) == [1, 2, 4, 8, 16, 17]  # the last multiple of 16 stays
    assert capture_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert capture_batch_sizes(256) == [1, 2, 4, 8, *range(16, 257, 16)]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("model", [TINY_QWEN3, SMOLLM2])
def test_replay_gives_the_eager_tokens(models_dir, hf_model, hf_tokenizer, hf_greedy, model,
                                        overlap):
    """Five prompts on four rows: decode batches of 4, then of 1 (padded to 1, 2 or 4 as they
    come), prefix hits, page size 4; every token equals transformers' greedy."""
    path = models_dir / model
    tokenizer = hf_tokenizer(model)
    expected = [hf_greedy(hf_model(model), tokenizer(p).input_ids, 10) for p in PROMPTS]
    got = generate(path, n_prompts=5, max_tokens=10, cuda_graph="emulate", overlap=overlap,
                   page_size=4)
    assert got == expected


def test_decode_steps_replay_and_prefill_does_not(models_dir, monkeypatch):
    replays: list[tuple[int, int]] = []
    original = GraphRunner.replay

    def counting(self, batch, rows, positions, padded):
        replays.append((batch.size, padded))
        logits = original(self, batch, rows, positions, padded)
        assert logits.shape[0] == batch.size  # the padding rows' logits stay behind
        return logits

    monkeypatch.setattr(GraphRunner, "replay", counting)
    generate(models_dir / TINY_QWEN3, n_prompts=3, max_tokens=5, cuda_graph="emulate",
             overlap=False)
    # One prefill of 3 prompts, then 4 decode steps of 3 requests, each padded to 4.
    assert replays == [(3, 4)] * 4


def test_an_eager_batch_scores_rows_padded_to_a_captured_size(models_dir, monkeypatch):
    # cuBLAS picks and loads a kernel the first time it meets a shape (11-23 ms on an H200's
    # host for the LM head at 119-238 rows): a prefill's LM head gets a captured batch size.
    scored: list[int] = []
    forward = LMHead.forward
    monkeypatch.setattr(LMHead, "forward",
                        lambda self, x: scored.append(x.shape[0]) or forward(self, x))
    path = models_dir / TINY_QWEN3
    got = generate(path, n_prompts=3, max_tokens=3, cuda_graph="emulate", overlap=False)
    # The capture scores 4, 2 and 1 rows (the emulated graphs' steps); then the prefill of 3
    # prompts scores 4, as the decode steps of 3 requests replayed at 4 do.
    assert scored[:3] == [4, 2, 1] and scored[3:] == [4] * (len(scored) - 3) and len(scored) > 4
    monkeypatch.undo()
    assert got == generate(path, n_prompts=3, max_tokens=3, cuda_graph="off", overlap=False)


def recorded_order(monkeypatch, s) -> list[tuple[str, str]]:
    """The scheduler's launches and reads, in order, as (what, phase)."""
    events: list[tuple[str, str]] = []
    launch, process = s._launch, s._process
    monkeypatch.setattr(s, "_launch", lambda batch: events.append(("launch", batch.phase))
                        or launch(batch))
    monkeypatch.setattr(s, "_process", lambda done, next_reqs: events.append(
        ("read", done.batch.phase)) or process(done, next_reqs))
    return events


def test_with_overlap_a_decode_in_flight_is_read_before_a_prefill_is_launched(monkeypatch):
    # A decode graph launches in no time: the next decode batch is launched first, then the
    # one in flight read (overlap). An eager prefill's launch takes as long as its compute:
    # a decode batch in flight is read first, so its tokens do not wait for that launch.
    s = make_scheduler(TINY_QWEN3, overlap=True, cuda_graph="emulate")
    events = recorded_order(monkeypatch, s)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    s.add_request(0, [1, 2, 3], params)
    for step in range(4):
        if step == 2:
            s.add_request(1, [4, 5, 6], params)
        s.step()
    assert events == [("launch", "prefill"),
                      ("launch", "decode"), ("read", "prefill"),
                      ("read", "decode"), ("launch", "prefill"),  # request 0 rides along
                      ("launch", "decode"), ("read", "prefill")]


def test_with_overlap_a_prefill_in_flight_is_read_after_the_next_prefill_is_launched(
        monkeypatch):
    # A prefill in flight computes about as long as the next one's launch takes: launching
    # first keeps the device busy, and its tokens are not held back. Here a 10-token prompt
    # in chunks of 4, and a second prompt admitted with its last chunk.
    s = make_scheduler(TINY_QWEN3, overlap=True, cuda_graph="emulate", max_prefill_length=4)
    events = recorded_order(monkeypatch, s)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    s.add_request(0, list(range(1, 11)), params)
    s.add_request(1, [4, 5], params)
    outputs = []
    while s.has_work:
        outputs += s.step()
    assert events[:6] == [("launch", "prefill"),  # tokens 0-3 of request 0
                          ("launch", "prefill"), ("read", "prefill"),  # 4-7
                          ("launch", "prefill"), ("read", "prefill"),  # 8-9, and request 1
                          ("launch", "decode")]
    assert sorted((o.uid, o.finished) for o in outputs) == [(0, False), (0, False), (0, True),
                                                            (1, False), (1, False), (1, True)]


def forgetful_replay(skip: str):
    """GraphRunner.replay with one of its copies left out."""
    def replay(self, batch, rows, positions, padded):
        n = batch.size
        if skip != "rows":
            self.rows[:n].copy_(rows)
        if skip != "positions":
            self.positions[:n].copy_(positions)
        if skip != "metadata":
            self.backend.prepare_replay(batch, padded)
        self.graphs[padded].replay()
        return self.logits[:n]
    return replay


@pytest.mark.parametrize("skip", ["positions", "rows", "metadata"])
def test_the_emulator_catches_a_forgotten_copy(models_dir, monkeypatch, skip):
    """Planted bug: the runner does not refill one static buffer before replaying. The graph
    then computes with what the buffer held at capture (or at the previous step), and the
    tokens go wrong — here on the CPU, as they would on a GPU."""
    path = models_dir / TINY_QWEN3
    eager = generate(path, cuda_graph="off", overlap=False)
    monkeypatch.setattr(GraphRunner, "replay", forgetful_replay(skip))
    assert generate(path, cuda_graph="emulate", overlap=False) != eager
    monkeypatch.undo()
    assert generate(path, cuda_graph="emulate", overlap=False) == eager  # the runner as is


@pytest.fixture
def fake_fi(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)
    for cls in (FlashInferBackend, FlashAttentionBackend):
        monkeypatch.setattr(cls, "unsupported_reason", classmethod(lambda cls, *args: None))
    return fake_flashinfer


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["flashinfer", "fa"])
def test_flashinfer_graph_decode_gives_the_eager_tokens(fake_fi, models_dir, name, page_size):
    """FlashInfer's CUDA-graph decode wrapper (faked: it reads its shape from the static
    buffers at run time, as replayed kernels do)."""
    path = models_dir / TINY_QWEN3
    eager = generate(path, cuda_graph="off", attention_backend=name, page_size=page_size)
    assert generate(path, cuda_graph="emulate", attention_backend=name,
                    page_size=page_size) == eager


@pytest.mark.parametrize("page_size", [1, 4])
def test_page_indices_computed_in_the_graph_equal_the_host_built_ones(fake_fi, page_size):
    """prepare_in_graph (recorded into the captured step) against the eager path's indices,
    built from the host's lists: requests of one page, of several, ending mid-page and on a
    page's edge, and a padding row at the dummy row (position 0: one key)."""
    rows_in_table, width = 5, 24
    pool = MHAKVPool(1, 128, page_size, 2, 8, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(page_size)
    pages = torch.randperm(128, generator=gen)[: rows_in_table * width // page_size]
    slots = pages.view(rows_in_table, -1).repeat_interleave(page_size, dim=1) * page_size
    page_table = (slots + torch.arange(width) % page_size).to(torch.int32)
    backend = FlashInferBackend(pool, page_table, num_qo_heads=4)
    dummy = rows_in_table - 1
    backend.init_graph(max_batch_size=4, dummy_row=dummy)
    rows, seq_lens = [2, 0, 3, dummy], [1, 2 * page_size, 2 * page_size + 1, 1]
    backend.prepare_in_graph(torch.tensor(rows), torch.tensor(seq_lens) - 1)
    _, _, want, *_ = backend._shape(rows, seq_lens, [1] * len(rows))
    assert backend.graph_indices[: len(want)].tolist() == want.tolist()


def test_tp2_with_graphs_equals_tp1(models_dir):
    path = models_dir / TINY_QWEN3
    assert generate(path, cuda_graph="emulate", tp_size=2) == generate(path, cuda_graph="off")


def test_closing_the_engine_frees_its_graphs_without_the_garbage_collector(models_dir):
    """Each graph holds its captured step, and the step holds the runner: a cycle. Left to the
    garbage collector, it would keep the graphs' memory pool and, through the model and the
    backend, the KV pool alive after close() — on a GPU the next engine then finds no memory."""
    engine = Engine(EngineConfig(str(models_dir / TINY_QWEN3), cuda_graph="emulate",
                                 max_running_req=2, num_page_override=64,
                                 max_seq_len_override=64))
    runner = weakref.ref(engine.graphs)
    gc.disable()
    try:
        engine.close()
        assert runner() is None
    finally:
        gc.enable()


def test_the_scheduler_starts_without_the_reserved_row_and_page(models_dir):
    llm = LLM(str(models_dir / TINY_QWEN3), max_running_req=4, num_page_override=64,
              max_seq_len_override=64, page_size=4, cuda_graph="emulate")
    try:
        scheduler = llm.backend.scheduler  # type: ignore[union-attr]
        engine = scheduler.engine
        assert engine.page_table.shape[0] == 5 and engine.dummy_row == 4
        assert sorted(scheduler.table.free_rows) == [0, 1, 2, 3]
        assert sorted(scheduler.cache.free_pages) == list(range(64))
        assert engine.kv_pool.num_pages == 65
        assert bool((engine.page_table[4] == 64 * 4).all())  # the spare page's first slot
        assert engine.max_seq_len == 64
    finally:
        llm.shutdown()


def test_the_warm_up_prefill_runs_on_the_spare_row_and_page_only(models_dir, monkeypatch):
    # A full prefill step's tokens, cut into requests of at most max_seq_len, all on the spare
    # row: no row, page or token of the scheduler's changes; only the spare page is written.
    engine = Engine(EngineConfig(str(models_dir / TINY_QWEN3), max_running_req=4, page_size=4,
                                 num_page_override=16, max_seq_len_override=40,
                                 cuda_graph="emulate"))
    try:
        launched = []
        launch = engine.launch
        monkeypatch.setattr(engine, "launch", lambda batch, sampled: launched.append(
            (batch.phase, [(r.table_idx, r.extend_len) for r in batch.reqs], sampled))
            or launch(batch, sampled))
        layers = range(engine.model.config.num_layers)
        before = [engine.page_table.clone(), engine.token_pool.clone(),
                  *(engine.kv_pool.k_cache(i).clone() for i in layers)]
        engine.warm_up(100)
        assert launched == [("prefill", [(4, 40), (4, 40), (4, 20)], [])]
        spare = engine.num_pages * engine.page_size  # the spare page's first slot
        assert torch.equal(engine.page_table, before[0])
        assert torch.equal(engine.token_pool, before[1])
        for i in layers:
            assert torch.equal(engine.kv_pool.k_cache(i)[:spare], before[2 + i][:spare])
        assert not torch.equal(engine.kv_pool.k_cache(0)[spare:], before[2][spare:])
    finally:
        engine.close()


def test_a_warm_up_out_of_memory_says_what_to_lower(models_dir, monkeypatch):
    # A full prefill step that does not fit stops the start with advice, not a request later.
    engine = Engine(EngineConfig(str(models_dir / TINY_QWEN3), max_running_req=4,
                                 num_page_override=16, max_seq_len_override=40))
    try:
        def no_memory(batch, sampled):  # type: ignore[no-untyped-def]
            raise torch.OutOfMemoryError("CUDA out of memory")
        monkeypatch.setattr(engine, "launch", no_memory)
        with pytest.raises(RuntimeError, match="prefill step of 100 tokens .* lower "
                                               "max_prefill_length or memory_ratio"):
            engine.warm_up(100)
    finally:
        engine.close()


def test_the_scheduler_asks_for_its_budget_and_only_a_gpu_warms_up(models_dir, monkeypatch):
    # The CPU has no kernels to choose for a new shape: tests and laptops skip the warm-up.
    asked: list[int | None] = []
    warmed: list[int] = []
    init = Engine.__init__
    monkeypatch.setattr(Engine, "__init__", lambda self, config, warm_up_tokens=None: (
        asked.append(warm_up_tokens) or init(self, config, warm_up_tokens)))
    monkeypatch.setattr(Engine, "warm_up", lambda self, n: warmed.append(n))
    make_scheduler(TINY_QWEN3, max_prefill_length=64, cuda_graph="emulate").engine.close()
    assert asked == [64] and warmed == []


def watch_a_workload(models_dir, monkeypatch, plant_spare_page: bool = False,
                     attention_backend: str = "torch") -> list[str]:
    """Sixteen requests of different lengths through four rows and a tight pool (prefix hits,
    evictions, decode batches shrinking from 4 to 1 and padded on replay), graphs emulated. At
    every launch, what each request of the batch holds is read off the page table; at every
    replay, where each row wrote its K and V and what the padding rows computed. Returns what
    was wrong: the reserved row or page in a request's hands, a padding row that wrote outside
    the reserved row's slot or read anything but it (its logits then differ from those of the
    all-padding capture: token 0 at position 0, attending to itself alone), pages missing at
    the end. `plant_spare_page` puts the reserved page among the scheduler's free pages first."""
    engine_launch, runner_replay, store_kv = Engine.launch, GraphRunner.replay, MHAKVPool.store_kv
    found: list[str] = []
    padded_replays = []
    writes: list[torch.Tensor] | None = None  # the slots each layer writes, while replaying
    pure_padding: list[torch.Tensor] = []  # a padding row's logits when nothing else is there

    def launch(engine, batch, sampled):
        spare = engine.num_pages  # the page only padding rows write to
        for req in batch.reqs:
            if req.table_idx == engine.dummy_row:
                found.append(f"request {req.uid} holds the reserved row")
            # Its slots for tokens [0, device_len) are allocated by now.
            pages = engine.page_table[req.table_idx, : req.device_len] // engine.page_size
            if bool((pages == spare).any()):
                found.append(f"request {req.uid} holds the reserved page")
        return engine_launch(engine, batch, sampled)

    def recording_store_kv(pool, k, v, out_loc, layer_id):
        if writes is not None:
            writes.append(out_loc.clone())
        return store_kv(pool, k, v, out_loc, layer_id)

    def replay(runner, batch, rows, positions, padded):
        nonlocal writes
        n, writes = batch.size, []
        try:
            logits = runner_replay(runner, batch, rows, positions, padded)
        finally:
            layers, writes = writes, None
        own = runner.page_table[rows, positions]  # each request's slot for its new token
        reserved = runner.page_table[runner.dummy_row]
        for loc in layers:
            if not torch.equal(loc[:n], own):
                found.append(f"a batch of {n} wrote its K and V at {loc[:n].tolist()}, "
                             f"not at its own slots {own.tolist()}")
            if not bool(torch.isin(loc[n:padded], reserved).all()):
                found.append(f"padding rows of a batch of {n} replayed at {padded} wrote K and V "
                             f"at slots {loc[n:padded].tolist()}, outside the reserved row's")
        if padded > n:
            padded_replays.append((n, padded))
            if not torch.allclose(runner.logits[n:padded], pure_padding[0].expand(padded - n, -1),
                                  rtol=1e-4, atol=1e-4):
                found.append(f"padding rows of a batch of {n} replayed at {padded} computed "
                             "from something besides the reserved row and page")
        return logits

    monkeypatch.setattr(Engine, "launch", launch)
    monkeypatch.setattr(GraphRunner, "replay", replay)
    monkeypatch.setattr(MHAKVPool, "store_kv", recording_store_kv)
    # On the CPU even where a GPU is: float32, so the padding rows' logits compare closely.
    llm = LLM(str(models_dir / TINY_QWEN3), max_running_req=4, num_page_override=24,
              max_seq_len_override=64, page_size=4, cuda_graph="emulate",
              attention_backend=attention_backend, device="cpu")
    try:
        scheduler = llm.backend.scheduler  # type: ignore[union-attr]
        engine = scheduler.engine
        # The last graph captured (batch 1) ran on padding alone: rows, metadata and positions
        # all at their start values, which name the reserved row, one key, position 0.
        assert engine.graphs.batch_sizes[0] == 1
        pure_padding.append(engine.graphs.logits[0].clone())
        if plant_spare_page:  # the next allocation takes it: pages are popped from the end
            scheduler.cache.free_pages.append(engine.num_pages)
        gen = torch.Generator().manual_seed(0)
        shared = torch.randint(0, 1000, (9,), generator=gen).tolist()  # a prefix several share
        prompts = [(shared if i % 3 == 0 else [])
                   + torch.randint(0, 1000, (3 + i % 7,), generator=gen).tolist()
                   for i in range(16)]
        params = [SamplingParams(max_tokens=2 + (5 * i) % 11, ignore_eos=True) for i in range(16)]
        llm.generate(prompts, params)
        assert padded_replays, "no decode batch was padded: the workload misses the case"
        stats = scheduler.stats()
        if stats["free_pages"] + stats["cached_pages"] != engine.num_pages or stats["locked_pages"]:
            found.append(f"pages not returned: {stats}")
        if stats["rows_free"] != 4:
            found.append(f"rows not returned: {stats}")
        if not bool((engine.page_table[engine.dummy_row] == engine.num_pages * 4).all()):
            found.append("the reserved row no longer points at the reserved page only")
        if bool(engine.token_pool[engine.dummy_row].any()):
            found.append("the reserved row's tokens were written")
    finally:
        llm.shutdown()
    return found


@pytest.mark.parametrize("backend", ["torch", "flashinfer"])
def test_a_workload_never_hands_out_the_reserved_row_or_page(models_dir, monkeypatch, fake_fi,
                                                              backend):
    """Nor does a padding row of a replay touch anything but them."""
    assert watch_a_workload(models_dir, monkeypatch, attention_backend=backend) == []


def test_the_workload_check_catches_the_reserved_page_handed_out(models_dir, monkeypatch):
    """The check itself: with the spare page among the free ones, a request gets it."""
    found = watch_a_workload(models_dir, monkeypatch, plant_spare_page=True)
    assert any("holds the reserved page" in problem for problem in found), found
    assert any("pages not returned" in problem for problem in found), found


def stale_padding_replay(self, batch, rows, positions, padded):
    """Planted bug: GraphRunner.replay without refilling the padding rows, which keep the rows
    of an earlier, larger batch: a real request's row, maybe another request's by now."""
    n = batch.size
    self.rows[:n].copy_(rows)
    self.positions[:n].copy_(positions)
    self.positions[n:padded].zero_()
    self.backend.prepare_replay(batch, padded)
    self.graphs[padded].replay()
    return self.logits[:n]


def real_row_padding(self, batch, padded_size):
    """Planted bug: the torch backend pads the attention with the first request's row, so the
    padding rows read that request's keys."""
    rows = [r.table_idx for r in batch.reqs]
    pad = padded_size - batch.size
    self.graph_rows[:padded_size].copy_(torch.tensor(rows + rows[:1] * pad))
    self.graph_seq_lens[:padded_size].copy_(
        torch.tensor([r.device_len for r in batch.reqs] + [1] * pad))


@pytest.mark.parametrize("plant, expected", [
    ((GraphRunner, "replay", stale_padding_replay), "wrote K and V at slots"),
    ((TorchAttentionBackend, "prepare_replay", real_row_padding), "computed from something"),
], ids=["runner-rows", "backend-rows"])
def test_the_workload_check_catches_padding_that_touches_a_real_row(models_dir, monkeypatch,
                                                                    plant, expected):
    """The check itself: padding left pointing at a real request's row. The tokens may well
    stay right (a padding row writes, at position 0, a key close to the one there), which is why
    the check looks at where the padding rows write and what they compute."""
    monkeypatch.setattr(*plant)
    found = watch_a_workload(models_dir, monkeypatch)
    assert any(expected in problem for problem in found), found


def test_configuration_is_checked():
    with pytest.raises(ValueError, match="cuda_graph must be auto, off or emulate"):
        EngineConfig("m", cuda_graph="on")
    with pytest.raises(ValueError, match="cuda_graph_max_bs must be >= 1"):
        EngineConfig("m", cuda_graph_max_bs=0)


def test_no_graphs_on_the_cpu_unless_emulated(models_dir):
    llm = LLM(str(models_dir / TINY_QWEN3), max_running_req=2, num_page_override=64,
              max_seq_len_override=64)
    try:
        assert llm.backend.scheduler.engine.graphs is None  # type: ignore[union-attr]
    finally:
        llm.shutdown()


# --- the chapter's example ---

import re  # noqa: E402

from processes import run_example  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answers are checked here")
def test_example_replays_and_matches_eager(hf_model, hf_tokenizer, hf_greedy):
    out = run_example("ch18_cuda_graph.py")
    assert re.search(r"^cuda_graph=emulate：捕获了 batch \[1, 2, 3\]，用时 [\d.]+ 秒$", out, re.M)
    assert re.search(r"^图回放与 eager 相同： True$", out, re.M)
    tokenizer = hf_tokenizer(SMOLLM2)
    expected = tokenizer.decode(hf_greedy(hf_model(SMOLLM2),
                                          tokenizer("The capital of France is").input_ids, 12))
    assert f"  emulate → {expected!r}" in out
