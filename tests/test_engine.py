"""engine.Engine: greedy output equals transformers token by token (alone and in a ragged batch),
the request-length rule, pool and max_seq_len sizing, and seeded sampling."""

from __future__ import annotations

import inspect

import pytest
import torch

import minisgl.core.context as context_module
import minisgl.engine.engine as engine_module
import minisgl.utils.device as device_module
from conftest import SMOLLM2, TINY_QWEN3
from minisgl.core import Batch, Req, SamplingParams, fit_max_tokens, get_global_ctx
from minisgl.engine import Engine, EngineConfig
from minisgl.kvcache import MHAKVPool
from minisgl.models import ModelConfig

CHAPTER = 6  # tools/steps.py check runs this module on chapter 6's own tree

MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "Name three prime numbers and explain why:", "def fibonacci(n):",
           "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole"]


class HandBatcher:
    """Prepares batches by hand as the chapter-6 main does: pages from a free list, the page
    table row of each request, input_ids / positions / out_loc, then the attention metadata."""

    def __init__(self, engine: Engine, shuffle_pages: bool = True) -> None:
        self.engine = engine
        pages = torch.randperm(engine.num_pages) if shuffle_pages else torch.arange(engine.num_pages)
        self.free_pages = pages.tolist()

    def out_loc(self, req: Req) -> torch.Tensor:
        row, size = self.engine.page_table[req.table_idx], self.engine.page_size
        for pos in range(req.cached_len, req.device_len):
            row[pos] = self.free_pages.pop() * size if pos % size == 0 else row[pos - 1] + 1
        return row[req.cached_len: req.device_len]

    def step(self, reqs: list[Req], phase: str):
        batch = Batch(reqs, phase)  # type: ignore[arg-type]
        batch.input_ids = torch.cat([r.input_ids[r.cached_len: r.device_len] for r in reqs]).long()
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
        batch.out_loc = torch.cat([self.out_loc(r) for r in reqs]).long()
        self.engine.attn_backend.prepare_metadata(batch)
        output = self.engine.forward_batch(batch, self.engine.sampler.prepare(batch))
        output.copy_done.synchronize()
        for req, token in zip(reqs, output.next_tokens_host.tolist()):
            req.complete_one()
            req.append_host(token)
        return output

    def run(self, reqs: list[Req]) -> None:
        phase = "prefill"
        while any(r.can_decode for r in reqs):
            self.step(reqs, phase)
            phase = "decode"


def new_req(ids: list[int], slot: int, params: SamplingParams | None = None) -> Req:
    params = params or SamplingParams(max_tokens=MAX_TOKENS)
    return Req(torch.tensor(ids, dtype=torch.int32), table_idx=slot, cached_len=0,
               output_len=params.max_tokens, uid=slot, sampling_params=params)


def make_engine(path, **overrides) -> Engine:
    options = dict(max_running_req=len(PROMPTS), page_size=4, num_page_override=128,
                   max_seq_len_override=256)
    options.update(overrides)
    return Engine(EngineConfig(str(path), **options))


@pytest.fixture
def qwen3_engine(tiny_qwen3_path) -> Engine:
    # Function-scoped: the engine created last owns the process-global Context.
    return make_engine(tiny_qwen3_path)


@pytest.fixture(scope="module")
def qwen3_prompts(hf_tokenizer) -> list[list[int]]:
    tokenizer = hf_tokenizer(TINY_QWEN3)
    return [tokenizer(p).input_ids for p in PROMPTS]


# --- alignment with transformers -----------------------------------------------------------------

def test_one_request_gives_hf_greedy_16_tokens(qwen3_engine, qwen3_prompts, hf_model, hf_greedy):
    req = new_req(qwen3_prompts[0], slot=0)
    HandBatcher(qwen3_engine).run([req])
    assert len(req.output_ids) == MAX_TOKENS
    assert req.output_ids == hf_greedy(hf_model(TINY_QWEN3), qwen3_prompts[0], MAX_TOKENS)


def test_four_requests_in_one_batch_each_give_hf_tokens_alone(qwen3_engine, qwen3_prompts,
                                                              hf_model, hf_greedy):
    assert len({len(p) for p in qwen3_prompts}) == 4  # really ragged
    reqs = [new_req(ids, slot) for slot, ids in enumerate(qwen3_prompts)]
    HandBatcher(qwen3_engine).run(reqs)
    hf = hf_model(TINY_QWEN3)
    assert [r.output_ids for r in reqs] == [hf_greedy(hf, ids, MAX_TOKENS)
                                            for ids in qwen3_prompts]


def test_smollm2_one_request_gives_hf_greedy_16_tokens(smollm2_path, hf_model, hf_tokenizer,
                                                       hf_greedy):
    engine = make_engine(smollm2_path, max_running_req=1, num_page_override=16,
                         max_seq_len_override=64)
    tokenizer = hf_tokenizer(SMOLLM2)
    prompt = tokenizer(PROMPTS[0]).input_ids
    req = new_req(prompt, slot=0)
    HandBatcher(engine).run([req])
    assert req.output_ids == hf_greedy(hf_model(SMOLLM2), prompt, MAX_TOKENS)
    assert tokenizer.decode(req.output_ids).startswith(" Paris")


def test_forward_batch_output_is_ready_on_the_host(qwen3_engine, qwen3_prompts):
    reqs = [new_req(ids, slot) for slot, ids in enumerate(qwen3_prompts[:2])]
    output = HandBatcher(qwen3_engine).step(reqs, "prefill")
    assert output.copy_done.query()
    assert output.next_tokens_host.dtype == torch.int32 and output.next_tokens_host.device.type == "cpu"
    assert output.next_tokens_host.tolist() == output.next_tokens_device.tolist()


def test_forward_batch_leaves_the_requests_lengths_to_the_caller(qwen3_engine, qwen3_prompts,
                                                                 monkeypatch):
    forward, unchanged = qwen3_engine.forward_batch, []

    def spy(batch, args):
        before = [(r.cached_len, r.device_len) for r in batch.reqs]
        output = forward(batch, args)
        unchanged.append(before == [(r.cached_len, r.device_len) for r in batch.reqs])
        return output

    monkeypatch.setattr(qwen3_engine, "forward_batch", spy)
    reqs = [new_req(ids, slot) for slot, ids in enumerate(qwen3_prompts[:2])]
    HandBatcher(qwen3_engine).step(reqs, "prefill")  # which calls complete_one itself
    assert unchanged == [True]
    assert [(r.cached_len, r.device_len, r.extend_len) for r in reqs] == \
        [(len(p), len(p) + 1, 1) for p in qwen3_prompts[:2]]


# --- admission and sizing --------------------------------------------------------------------------

def test_fit_max_tokens_rejects_naming_prompt_length_and_max_seq_len():
    with pytest.raises(ValueError) as info:
        fit_max_tokens(prompt_len=90, max_tokens=11, max_seq_len=100)
    message = str(info.value)
    assert "90" in message and "11" in message and "max_seq_len is 100" in message


def test_fit_max_tokens_accepts_exactly_max_seq_len():
    assert fit_max_tokens(prompt_len=90, max_tokens=10, max_seq_len=100) == 10


def test_fit_max_tokens_without_max_tokens_is_as_many_as_fit():
    assert fit_max_tokens(prompt_len=90, max_tokens=None, max_seq_len=100) == 10
    with pytest.raises(ValueError, match="^prompt has 100 tokens; max_seq_len is 100$"):
        fit_max_tokens(prompt_len=100, max_tokens=None, max_seq_len=100)


def test_fit_max_tokens_rejects_an_empty_prompt():
    with pytest.raises(ValueError, match="empty"):
        fit_max_tokens(prompt_len=0, max_tokens=1, max_seq_len=100)


def test_max_seq_len_is_the_override_when_the_pool_is_larger(tiny_qwen3_path):
    engine = make_engine(tiny_qwen3_path, num_page_override=128, page_size=4,
                         max_seq_len_override=100)
    assert engine.max_seq_len == 100


def test_max_seq_len_is_the_pool_size_when_the_pool_is_smaller(tiny_qwen3_path):
    engine = make_engine(tiny_qwen3_path, num_page_override=10, page_size=4,
                         max_seq_len_override=100)
    assert engine.max_seq_len == 40 == engine.num_pages * engine.page_size


def test_max_seq_len_defaults_to_max_position(tiny_qwen3_path):
    engine = make_engine(tiny_qwen3_path, num_page_override=2000, page_size=4,
                         max_seq_len_override=None)
    assert engine.max_seq_len == ModelConfig.from_dir(tiny_qwen3_path).max_position == 4096


def test_max_seq_len_never_exceeds_max_position_even_with_a_larger_override(tiny_qwen3_path):
    # RoPE's cos/sin table has max_position rows and positions are not checked in the forward:
    # a request admitted beyond it fails with an IndexError (on CUDA: reads out of bounds).
    engine = make_engine(tiny_qwen3_path, max_running_req=1, num_page_override=3000,
                         page_size=4, max_seq_len_override=8192)
    assert engine.max_seq_len == 4096


def test_kv_pool_is_sized_from_cpu_kv_cache_bytes(tiny_qwen3_path):
    c = ModelConfig.from_dir(tiny_qwen3_path)
    page_bytes = MHAKVPool.page_bytes(c.num_layers, 4, c.num_kv_heads, c.head_dim, torch.float32)
    engine = make_engine(tiny_qwen3_path, page_size=4, num_page_override=None, device="cpu",
                         cpu_kv_cache_bytes=37 * page_bytes + page_bytes // 2)
    assert engine.kv_pool.num_pages == 37  # what the budget holds
    spare = 1 if hasattr(engine, "dummy_row") else 0  # from chapter 18: the padding rows' page
    assert engine.num_pages == 37 - spare
    assert engine.kv_pool.num_slots == 37 * 4


def test_kv_budget_below_one_page_raises(tiny_qwen3_path):
    with pytest.raises(ValueError, match="budget"):
        make_engine(tiny_qwen3_path, num_page_override=None, device="cpu",
                    cpu_kv_cache_bytes=100)


@pytest.mark.parametrize("field", ["max_running_req", "page_size", "num_page_override",
                                   "max_seq_len_override"])
@pytest.mark.parametrize("value", [0, -1])
def test_engine_config_rejects_values_below_one(field, value):
    # An override of 0 is not "no override" (that is None): it is refused like -1.
    with pytest.raises(ValueError, match=f"{field} must be >= 1, got {value}"):
        EngineConfig("unused", **{field: value})


# --- seeded sampling -----------------------------------------------------------------------------

def sample_run(path, prompts: list[list[int]], seed: int) -> list[list[int]]:
    engine = make_engine(path, seed=seed)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=MAX_TOKENS)
    reqs = [new_req(ids, slot, params) for slot, ids in enumerate(prompts)]
    HandBatcher(engine, shuffle_pages=False).run(reqs)
    return [r.output_ids for r in reqs]


def test_seeded_sampling_is_reproducible_across_engines(tiny_qwen3_path, qwen3_prompts):
    first = sample_run(tiny_qwen3_path, qwen3_prompts[:2], seed=1234)
    second = sample_run(tiny_qwen3_path, qwen3_prompts[:2], seed=1234)
    assert first == second and all(len(out) == MAX_TOKENS for out in first)


def test_different_seeds_sample_differently(tiny_qwen3_path, qwen3_prompts):
    assert (sample_run(tiny_qwen3_path, qwen3_prompts[:1], seed=1)
            != sample_run(tiny_qwen3_path, qwen3_prompts[:1], seed=2))


# --- close(): the process as the constructor found it ---------------------------------------------

@pytest.fixture
def fresh_process(monkeypatch):
    """No global Context, and a thread count (3) that the engine changes (to 1 core, faked);
    returns that count. Both are put back after the test."""
    monkeypatch.setattr(context_module, "_GLOBAL_CTX", None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device_module, "physical_core_count", lambda: 1)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


def installed_ctx():
    try:
        return get_global_ctx()
    except RuntimeError:
        return None


def test_close_uninstalls_the_context_and_restores_the_thread_count(tiny_qwen3_path,
                                                                    fresh_process):
    engine = make_engine(tiny_qwen3_path, device="cpu")
    assert installed_ctx() is engine.ctx
    assert torch.get_num_threads() == engine.num_threads == 1
    engine.close()
    assert installed_ctx() is None and torch.get_num_threads() == fresh_process
    engine.close()  # a second close changes nothing
    assert installed_ctx() is None and torch.get_num_threads() == fresh_process


def test_engines_created_closed_and_recreated_in_one_process_give_the_same_tokens(
        tiny_qwen3_path, qwen3_prompts, fresh_process):
    outputs = []
    for _ in range(3):
        engine = make_engine(tiny_qwen3_path, device="cpu")
        req = new_req(qwen3_prompts[0], 0)
        HandBatcher(engine, shuffle_pages=False).run([req])
        engine.close()
        assert installed_ctx() is None and torch.get_num_threads() == fresh_process
        outputs.append(req.output_ids)
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) == MAX_TOKENS


def test_closing_an_older_engine_leaves_the_newer_ones_context(tiny_qwen3_path, fresh_process):
    older = make_engine(tiny_qwen3_path, device="cpu")
    newer = make_engine(tiny_qwen3_path, device="cpu")
    older.close()
    assert installed_ctx() is newer.ctx
    newer.close()
    assert installed_ctx() is None


def test_a_constructor_failing_half_way_leaves_the_process_as_it_found_it(tiny_qwen3_path,
                                                                         fresh_process,
                                                                         monkeypatch):
    def no_sampler(*args, **kwargs):
        raise RuntimeError("no sampler")

    # The Sampler is built last: the threads are set and the Context installed by then.
    monkeypatch.setattr(engine_module, "Sampler", no_sampler)
    with pytest.raises(RuntimeError, match="no sampler"):
        make_engine(tiny_qwen3_path, device="cpu")
    assert installed_ctx() is None and torch.get_num_threads() == fresh_process


# --- streams: the engine's forward waits for what it reads ---------------------------------------

class RecordingStream:
    """Stands in for the engine's stream on the CPU and records what it was told to wait for."""

    def __init__(self) -> None:
        self.waited_for: list[object] = []

    def wait_stream(self, stream: object) -> None:
        self.waited_for.append(stream)


def test_forward_batch_waits_for_the_stream_the_batch_was_written_on(qwen3_engine, qwen3_prompts,
                                                                    monkeypatch):
    # The caller fills the page table and the batch's tensors on its current stream (the
    # default one, up to chapter 10); the forward runs on the engine's, which must wait for it.
    callers_stream = object()
    monkeypatch.setattr(engine_module, "current_stream", lambda device: callers_stream)
    qwen3_engine.stream = RecordingStream()
    HandBatcher(qwen3_engine).step([new_req(qwen3_prompts[0], 0)], "prefill")
    assert qwen3_engine.stream.waited_for == [callers_stream]


def test_forward_batch_called_on_the_engines_own_stream_waits_for_nothing(qwen3_engine,
                                                                         qwen3_prompts,
                                                                         monkeypatch):
    # A scheduler that made the engine's stream wait for its own, and calls from there
    # (chapter 11 on), is not waited for twice each step.
    qwen3_engine.stream = RecordingStream()
    monkeypatch.setattr(engine_module, "current_stream", lambda device: qwen3_engine.stream)
    HandBatcher(qwen3_engine).step([new_req(qwen3_prompts[0], 0)], "prefill")
    assert qwen3_engine.stream.waited_for == []


def test_the_constructor_waits_for_its_own_work_once_everything_is_built(tiny_qwen3_path,
                                                                         monkeypatch):
    # The pools and the page table are zero-filled on the default stream; the engine's streams
    # read them. On an H200 a second engine of a process read its page table before the fill
    # ran: old slots from the memory the first engine freed (chapter 21).
    calls = []

    def synchronize(device):
        building = inspect.currentframe().f_back.f_locals["self"]  # the engine being built
        calls.append((device, [name for name in ("kv_pool", "page_table", "sampler")
                               if hasattr(building, name)]))

    monkeypatch.setattr(engine_module, "synchronize", synchronize)
    engine = make_engine(tiny_qwen3_path, device="cpu")
    assert calls == [(engine.device, ["kv_pool", "page_table", "sampler"])]


# --- the chapter's example ---

import ast  # noqa: E402
import re  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_greedy_row_is_transformers_greedy(hf_model, hf_tokenizer, hf_greedy):
    out = run_example("ch06_engine.py")
    assert re.search(r"^设备 \w+，\d+ 个线程，KV 池 64 页$", out, re.M)  # num_page_override=64
    texts = [ast.literal_eval(t) for t in re.findall(r"^  → (.*)$", out, re.M)]
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    tokenizer = hf_tokenizer(SMOLLM2)
    prompt = tokenizer("The capital of France is").input_ids
    # Row 0 is greedy: 12 tokens, the example does not stop at EOS.
    assert texts[0] == tokenizer.decode(hf_greedy(hf_model(SMOLLM2), prompt, 12))
    assert re.search(r"^SamplingParams\(temperature=0\.8, .*top_p=0\.9", out, re.M)
    # The book's message for a request that cannot fit: max_seq_len_override=64, 60 + 16 > 64.
    assert "ValueError: prompt has 60 tokens and asks for up to 16 more; max_seq_len is 64" in out
