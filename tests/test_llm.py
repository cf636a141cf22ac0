"""llm.LLM: the offline generate() over the scheduler — prompt forms, sampling params, order,
alignment with transformers, EOS handling, input validation before anything is queued,
shutdown, and seeded sampling (the chapter-0 quickstart: tests/test_quickstart.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import MODELS_DIR, TINY_QWEN3
from minisgl.core import SamplingParams
from minisgl.llm import LLM

CHAPTER = 11  # tools/steps.py check runs this module on chapter 11's own tree

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three prime numbers:"]


def make_llm(model: str = TINY_QWEN3, **overrides) -> LLM:
    options = dict(max_running_req=4, page_size=4, num_page_override=128,
                   max_seq_len_override=256)
    options.update(overrides)
    return LLM(str(MODELS_DIR / model), dtype=torch.float32, **options)


def greedy(max_tokens: int, ignore_eos: bool = True) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)


def scheduler_of(llm: LLM):
    """The Scheduler inside an in-process LLM: chapter 11 holds it directly, chapter 16 behind a
    backend (in this process, or rank processes for TP > 1)."""
    return llm.backend.scheduler if hasattr(llm, "backend") else llm.scheduler


@pytest.fixture
def llm() -> LLM:
    # Function-scoped: the engine created last owns the process-global Context.
    return make_llm()


@pytest.fixture(scope="module")
def alone() -> dict[tuple[str, int], list[int]]:
    """Greedy token ids of each PROMPTS entry generated alone, for 10 tokens (ignore_eos)."""
    single = make_llm(max_running_req=1)
    refs = {(p, 10): single.generate([p], greedy(10))[0]["token_ids"] for p in PROMPTS}
    single.shutdown()
    return refs


# --- inputs and outputs ---------------------------------------------------------------------------

def test_strings_and_token_id_lists_give_the_same_result(llm):
    ids = [llm.tokenizer(p).input_ids for p in PROMPTS]
    from_text = llm.generate(PROMPTS, greedy(6))
    from_ids = llm.generate(ids, greedy(6))
    assert from_text == from_ids


def test_one_sampling_params_applies_to_every_prompt(llm):
    one = llm.generate(PROMPTS, greedy(5))
    listed = llm.generate(PROMPTS, [greedy(5)] * len(PROMPTS))
    assert one == listed and all(len(o["token_ids"]) == 5 for o in one)


def test_a_list_of_sampling_params_applies_one_per_prompt(llm):
    outputs = llm.generate(PROMPTS, [greedy(2), greedy(7), greedy(4)])
    assert [len(o["token_ids"]) for o in outputs] == [2, 7, 4]


def test_outputs_come_back_in_prompt_order(llm, alone):
    # The first prompt finishes last and the last first: the order must still be the prompts'.
    params = [greedy(10), greedy(6), greedy(2)]
    outputs = llm.generate(PROMPTS, params)
    assert [o["token_ids"] for o in outputs] == \
        [alone[(p, 10)][: sp.max_tokens] for p, sp in zip(PROMPTS, params)]


def test_text_is_the_decoding_of_token_ids(llm):
    for output in llm.generate(PROMPTS, greedy(6)):
        assert output["text"] == llm.tokenizer.decode(output["token_ids"])


def test_greedy_outputs_equal_hf_greedy_per_prompt(llm, hf_model, hf_greedy):
    outputs = llm.generate(PROMPTS, greedy(12))
    hf = hf_model(TINY_QWEN3)
    for prompt, output in zip(PROMPTS, outputs):
        ids = llm.tokenizer(prompt).input_ids
        assert output["token_ids"] == hf_greedy(hf, ids, 12), prompt


def test_generate_can_be_called_again(llm, alone):
    first = llm.generate(PROMPTS[:1], greedy(10))
    second = llm.generate(PROMPTS[:1], greedy(10))
    assert first == second and first[0]["token_ids"] == alone[(PROMPTS[0], 10)]


# --- EOS ------------------------------------------------------------------------------------------

def first_new_token(tokens: list[int], start: int = 2) -> int:
    """The index of the first token at or after `start` that did not occur before it."""
    return next(k for k in range(start, len(tokens)) if tokens[k] not in tokens[:k])


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_eos_that_ends_a_request_is_left_out_of_token_ids(overlap, alone):
    ref = alone[(PROMPTS[0], 10)]
    k = first_new_token(ref)
    llm = make_llm(overlap=overlap)
    scheduler_of(llm).eos_token_ids = frozenset({ref[k]})  # the model "emits EOS" at step k
    (output,) = llm.generate(PROMPTS[:1], greedy(10, ignore_eos=False))
    assert output["token_ids"] == ref[:k]
    assert output["text"] == llm.tokenizer.decode(ref[:k])


def test_eos_is_kept_with_ignore_eos(alone):
    ref = alone[(PROMPTS[0], 10)]
    k = first_new_token(ref)
    llm = make_llm()
    scheduler_of(llm).eos_token_ids = frozenset({ref[k]})
    (output,) = llm.generate(PROMPTS[:1], greedy(10, ignore_eos=True))
    assert output["token_ids"] == ref and ref[k] in output["token_ids"]


def test_eos_stops_only_the_request_that_meets_it(alone):
    ref = alone[(PROMPTS[0], 10)]
    k = first_new_token(ref)
    others = [alone[(p, 10)] for p in PROMPTS[1:]]
    assert all(ref[k] not in o for o in others)
    llm = make_llm()
    scheduler_of(llm).eos_token_ids = frozenset({ref[k]})
    outputs = llm.generate(PROMPTS, greedy(10, ignore_eos=False))
    assert [o["token_ids"] for o in outputs] == [ref[:k], *others]


# --- validation -----------------------------------------------------------------------------------

def test_mismatched_sampling_params_length_raises_before_queueing(llm):
    with pytest.raises(ValueError, match="3 prompts but 2 sampling params"):
        llm.generate(PROMPTS, [greedy(4), greedy(4)])
    assert not scheduler_of(llm).has_work


@pytest.mark.parametrize("empty", ["", []], ids=["text", "ids"])
def test_empty_prompt_raises_before_queueing(llm, empty):
    with pytest.raises(ValueError, match="empty"):
        llm.generate([PROMPTS[0], empty], greedy(4))
    assert not scheduler_of(llm).has_work


def test_too_long_prompt_raises_before_queueing():
    llm = make_llm(max_seq_len_override=32)
    with pytest.raises(ValueError, match="max_seq_len is 32"):
        llm.generate([PROMPTS[0], list(range(3, 33))], greedy(4))  # 30 + 4 > 32
    assert not scheduler_of(llm).has_work


def test_a_rejected_call_leaves_the_llm_usable(llm, alone):
    with pytest.raises(ValueError):
        llm.generate([PROMPTS[0], ""], greedy(10))
    (output,) = llm.generate(PROMPTS[:1], greedy(10))
    assert output["token_ids"] == alone[(PROMPTS[0], 10)]


def test_generate_after_shutdown_raises(llm):
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(PROMPTS, greedy(4))


# --- sampling -------------------------------------------------------------------------------------

def sample(seed: int) -> list[list[int]]:
    llm = make_llm(seed=seed)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    llm.shutdown()
    return [o["token_ids"] for o in outputs]


def test_seeded_sampling_is_reproducible_across_llm_instances():
    first, second = sample(seed=1234), sample(seed=1234)
    assert first == second and all(len(tokens) == 12 for tokens in first)


def test_different_seeds_sample_differently():
    assert sample(seed=1) != sample(seed=2)
