"""Chapter 13: chat templates, incremental detokenizing, stop strings, the tokenizer process and
the child-process helpers it runs under."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, TokenizeMsg, UserMsg,
                             UserReply, decode, encode, unbatch)
from minisgl.tokenizer import (DetokenizeManager, IncrementalDetokenizer, StopMatcher,
                               TokenizeManager)
from minisgl.tokenizer.worker import TokenizerWorker
from minisgl.utils.process import Children
from minisgl.utils.zmq_queue import PullQueue, PushQueue, ipc_address, new_run_id

from processes import descendants_of, running, wait_all_gone

CHAPTER = 13  # tools/steps.py check runs this module on chapter 13's own tree

SMOLLM2 = "SmolLM2-135M-Instruct"
IM_END = 2  # SmolLM2's <|im_end|>: the end of a chat turn, and its EOS
CHAT = [{"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "法国的首都是哪里？"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy? 🙂"}]
TEXTS = ["你好，世界！", "emoji 🙂🚀 与 café", "日本語のテキスト😀", "한국어 문장입니다",
         "naïve façade — “quotes” ½ €", "🧑‍🚀 flag 🇨🇳 done\n\ttab"]


@pytest.fixture(scope="module")
def tok(hf_tokenizer):
    return hf_tokenizer(SMOLLM2)


@pytest.fixture
def fresh_tok(smollm2_path):
    """A tokenizer of our own, for tests that change its settings."""
    return AutoTokenizer.from_pretrained(smollm2_path)


def stream(tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    return [detok.add(i) for i in ids] + [detok.finish()]


def full_decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


# --------------------------------------------------------------------------- TokenizeManager


def test_chat_ids_equal_template_text_tokenized_without_special_tokens(tok):
    ours = TokenizeManager(tok).tokenize(CHAT)
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")  # the answer's turn is opened
    assert ours.dtype == torch.int32 and ours.dim() == 1
    assert ours.tolist() == tok(text, add_special_tokens=False).input_ids


def test_plain_text_is_tokenized_as_is(tok):
    ids = TokenizeManager(tok).tokenize("The capital of France is")
    assert ids.dtype == torch.int32 and ids.tolist() == tok("The capital of France is").input_ids


def test_a_tokenizer_that_adds_bos_gets_it_once_in_a_chat(fresh_tok):
    fresh_tok.add_bos_token = True  # like Llama's: BOS before every encoded text
    bos = fresh_tok.bos_token_id
    assert fresh_tok("hi").input_ids[0] == bos
    manager = TokenizeManager(fresh_tok)
    chat_ids = manager.tokenize([{"role": "user", "content": "hi"}]).tolist()
    assert chat_ids[0] == bos and chat_ids[1] != bos  # the template's own, not doubled
    assert manager.tokenize("hi").tolist()[0] == bos


def test_an_empty_prompt_is_refused(tok):
    with pytest.raises(ValueError, match="empty"):
        TokenizeManager(tok).tokenize("")


def test_a_chat_without_a_chat_template_is_refused(fresh_tok):
    fresh_tok.chat_template = None
    manager = TokenizeManager(fresh_tok)
    with pytest.raises(ValueError, match="no chat template"):
        manager.tokenize([{"role": "user", "content": "hi"}])
    assert manager.tokenize("hi").tolist() == fresh_tok("hi").input_ids  # plain text still works


# --------------------------------------------------------------------------- IncrementalDetokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_join_to_the_full_decode(tok, text):
    ids = tok(text).input_ids
    pieces = stream(tok, ids)
    assert "".join(pieces) == full_decode(tok, ids) == text
    assert not any("\ufffd" in p for p in pieces)


def test_a_character_appears_when_its_last_byte_arrives(tok):
    ids = tok("你好，世界！").input_ids
    assert len(ids) == 12  # every CJK character is split over 2 or 3 byte tokens
    assert stream(tok, ids) == ["", "你", "", "好", "，", "", "世", "", "", "界", "", "！", ""]


def test_random_unicode_text_streams_without_replacement_characters(tok):
    rng = random.Random(0)
    ranges = [(0x20, 0x7E), (0xC0, 0x24F), (0x4E00, 0x9FFF), (0x1F300, 0x1F64F)]
    for _ in range(100):
        text = "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(30))
        ids = tok(text, add_special_tokens=False).input_ids
        pieces = stream(tok, ids)
        assert "".join(pieces) == text, text
        assert not any("\ufffd" in p for p in pieces), text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_token_ids_stream_to_the_full_decode(tok, seed):
    rng = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(tok), (3000,), generator=rng).tolist()
    assert "".join(stream(tok, ids)) == full_decode(tok, ids)


def test_random_byte_tokens_stream_to_the_full_decode(tok):
    """Byte tokens alone make the hardest streams: characters cut anywhere, invalid UTF-8."""
    byte_ids = [i for i in range(len(tok)) if len(tok.convert_ids_to_tokens(i)) == 1]
    assert len(byte_ids) > 200
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.choice(byte_ids) for _ in range(200)]
        assert "".join(stream(tok, ids)) == full_decode(tok, ids)


def test_finish_releases_a_cut_character_once(tok):
    """A stream cut inside a character (max_tokens reached) ends as the full decode does, with
    U+FFFD; what finish() released is not released again."""
    first_byte = tok("好").input_ids[0]
    detok = IncrementalDetokenizer(tok)
    assert detok.add(first_byte) == ""
    assert detok.finish() == "\ufffd" == full_decode(tok, [first_byte])
    assert detok.finish() == ""


def test_special_tokens_produce_no_text(tok):
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(i) for i in tok("Hi").input_ids]
    assert detok.add(IM_END) == "" and detok.finish() == ""
    ids = tok("a").input_ids + [1, IM_END] + tok(" b").input_ids  # specials in the middle too
    assert "".join(stream(tok, ids)) == "a b"
    assert "".join(pieces) == "Hi"


def test_the_decode_window_stays_short(tok):
    detok = IncrementalDetokenizer(tok)
    ids = tok(" ".join(["word"] * 500)).input_ids
    for i in ids:
        detok.add(i)
        assert len(detok.ids) - detok.prefix_offset <= 2  # not the whole history every step
    assert detok.finish() == ""


# --------------------------------------------------------------------------- Metaspace tokenizers
# SmolLM2's tokenizer is byte-level BPE: a token decodes to the same text wherever it stands.
# SentencePiece tokenizers (Llama 2, Mistral, Gemma) do not: "▁" marks a word's leading space
# and decoding drops the space of the first token, so "▁world" alone is "world" but after
# "▁Hello" is " world"; characters outside the vocabulary fall back to byte tokens <0xNN>.

META_WORDS = ["▁Hello", "▁world", "▁again", "▁你好", "世界", "，", "！", "▁"]
META_LETTERS = list("abcdefghijklmnopqrstuvwxyz") + [f"▁{c}" for c in "abcdefghijklmnopqrstuvwxyz"]


@pytest.fixture(scope="module")
def meta_tok():
    """An in-memory Unigram tokenizer with a Metaspace pre-tokenizer and decoder and byte
    fallback, as transformers wraps a SentencePiece model: no files, no downloads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ([("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
             + [(f"<0x{b:02X}>", -10.0) for b in range(256)]
             + [(w, -1.0) for w in META_WORDS] + [(c, -2.0) for c in META_LETTERS])
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([
        decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


def test_a_metaspace_token_decodes_alone_without_its_leading_space(meta_tok):
    ids = meta_tok("Hello world", add_special_tokens=False).input_ids
    assert meta_tok.convert_ids_to_tokens(ids) == ["▁Hello", "▁world"]
    assert [meta_tok.decode([i]) for i in ids] == ["Hello", "world"]  # why a window is needed
    assert meta_tok.decode(ids) == "Hello world"


@pytest.mark.parametrize("text, tokens, pieces", [
    ("Hello world again", ["▁Hello", "▁world", "▁again"], ["Hello", " world", " again", ""]),
    ("你好 世界 again", ["▁你好", "▁", "世界", "▁again"], ["你好", " ", "世界", " again", ""]),
    ("x 日本", ["▁x", "▁", "<0xE6>", "<0x97>", "<0xA5>", "<0xE6>", "<0x9C>", "<0xAC>"],
     ["x", " ", "", "", "日", "", "", "本", ""]),
    ("Hello  world 🙂 café",
     ["▁Hello", "▁", "▁world", "▁", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>", "▁c", "a", "f",
      "<0xC3>", "<0xA9>"],
     ["Hello", " ", " world", " ", "", "", "", "🙂", " c", "a", "f", "", "é", ""]),
    # Decoding with clean_up_tokenization_spaces would print "world!": the model wrote " !".
    ("Hello world ! again", ["▁Hello", "▁world", "▁", "<0x21>", "▁again"],
     ["Hello", " world", " ", "!", " again", ""]),
])
def test_metaspace_stream_keeps_every_space(meta_tok, text, tokens, pieces):
    ids = meta_tok(text, add_special_tokens=False).input_ids
    assert meta_tok.convert_ids_to_tokens(ids) == tokens
    assert stream(meta_tok, ids) == pieces
    assert "".join(pieces) == full_decode(meta_tok, ids) == text


def test_random_metaspace_texts_stream_to_the_full_decode(meta_tok):
    """Words in and out of the vocabulary (CJK and emoji as byte tokens), single and double
    spaces, a leading space (which SentencePiece's decode drops: so does the stream)."""
    parts = ["Hello", "world", "again", "你好", "世界", "，", "日本", "🙂", "é", "a", "b", " ", "  ",
             "!", "?", ",", "'s"]
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 20)))
        ids = meta_tok(text, add_special_tokens=False).input_ids
        pieces = stream(meta_tok, ids)
        assert "".join(pieces) == full_decode(meta_tok, ids) == text.removeprefix(" "), text
        assert not any("\ufffd" in p for p in pieces), text


def test_random_metaspace_token_sequences_stream_to_the_full_decode(meta_tok):
    """Token ids drawn at random: words, letters, bare "▁", special tokens, and whole characters
    as byte tokens. (Not single random bytes: ByteFallback turns a whole run of byte tokens into
    U+FFFD when any byte of it is invalid, so a full decode of broken UTF-8 depends on bytes
    that come later; no stream can match that, and a model that emits it prints garbage.)"""
    words = meta_tok.convert_tokens_to_ids(META_WORDS + META_LETTERS + ["<s>", "</s>"])
    rng = random.Random(1)
    for _ in range(100):
        ids: list[int] = []
        while len(ids) < 40:
            if rng.random() < 0.3:
                char = chr(rng.choice([rng.randint(0xA0, 0x24F), rng.randint(0x4E00, 0x9FFF),
                                       rng.randint(0x1F300, 0x1F64F)]))
                ids += meta_tok.convert_tokens_to_ids(
                    [f"<0x{b:02X}>" for b in char.encode()])
            else:
                ids.append(rng.choice(words))
        assert "".join(stream(meta_tok, ids)) == full_decode(meta_tok, ids), ids


# --------------------------------------------------------------------------- DetokenizeManager


def test_detokenize_manager_streams_interleaved_requests_and_drops_finished_ones(tok):
    manager = DetokenizeManager(tok)
    a, b = tok("你好，世界！").input_ids, tok("emoji 🙂🚀").input_ids
    out: dict[int, list[UserReply]] = {1: [], 2: []}
    for n in range(max(len(a), len(b))):
        for uid, ids in ((1, a), (2, b)):
            if n < len(ids):
                out[uid].append(manager.detokenize(DetokenizeMsg(uid, ids[n], n == len(ids) - 1)))
    assert "".join(r.incremental_output for r in out[1]) == "你好，世界！"
    assert "".join(r.incremental_output for r in out[2]) == "emoji 🙂🚀"
    assert [r.finished for r in out[1]] == [False] * (len(a) - 1) + [True]
    assert all(r.uid == 2 for r in out[2])
    assert manager.streams == {}


def test_detokenize_manager_passes_an_error_through(tok):
    manager = DetokenizeManager(tok)
    manager.detokenize(DetokenizeMsg(7, tok("Hi").input_ids[0], False))
    reply = manager.detokenize(DetokenizeMsg(7, -1, True, error="prompt has 600 tokens; max 512"))
    assert reply == UserReply(7, "", True, "prompt has 600 tokens; max 512")
    assert 7 not in manager.streams


def test_next_token_minus_one_yields_no_text(tok):
    manager = DetokenizeManager(tok)
    first = manager.detokenize(DetokenizeMsg(3, tok("Hi").input_ids[0], False))
    assert first.incremental_output == "Hi"
    assert manager.detokenize(DetokenizeMsg(3, -1, False)).incremental_output == ""
    assert manager.detokenize(DetokenizeMsg(3, -1, True)) == UserReply(3, "", True)


def test_detokenize_manager_releases_held_text_with_the_last_reply(tok):
    ids = tok("好").input_ids  # two byte tokens: the character is cut after the first
    manager = DetokenizeManager(tok)
    reply = manager.detokenize(DetokenizeMsg(4, ids[0], True))
    assert reply.incremental_output == full_decode(tok, ids[:1]) == "\ufffd" and reply.finished


def test_token_id_zero_is_text_like_any_other():
    """-1 means "no token"; 0 is a token, and in some vocabularies text (Qwen's id 0 is "!")."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"!": 0, "Hi": 1, "<unk>": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    manager = DetokenizeManager(PreTrainedTokenizerFast(tokenizer_object=words,
                                                        unk_token="<unk>"))
    replies = [manager.detokenize(DetokenizeMsg(6, token, finished))
               for token, finished in [(1, False), (0, False), (0, True)]]
    assert [r.incremental_output for r in replies] == ["Hi", " !", " !"]


# --------------------------------------------------------------------------- StopMatcher


def run_matcher(stops: list[str], pieces: list[str]) -> tuple[str, StopMatcher]:
    matcher = StopMatcher(stops)
    return "".join(matcher.feed(p) for p in pieces) + matcher.flush(), matcher


def test_a_stop_string_straddling_two_pieces_is_found():
    matcher = StopMatcher(["Observation:"])
    assert matcher.feed("Thought: look it up. Obs") == "Thought: look it up. "
    assert not matcher.stopped
    assert matcher.feed("ervation: 42") == ""
    assert matcher.stopped


def test_the_earliest_of_several_stop_strings_wins():
    out, matcher = run_matcher(["world", "lo"], ["hello world"])
    assert out == "hel" and matcher.stopped


def test_a_held_back_tail_is_released_by_flush_when_no_stop_comes():
    matcher = StopMatcher(["</s>"])
    assert matcher.feed("x < y, and a <") == "x < y, and a "
    assert matcher.feed("/") == ""  # "</" could still become "</s>"
    assert matcher.flush() == "</"
    assert not matcher.stopped


def test_a_held_back_tail_is_released_by_a_piece_that_rules_the_stop_out():
    matcher = StopMatcher(["</s>"])
    assert matcher.feed("a <") == "a "
    assert matcher.feed("b") == "<b"


def test_after_a_stop_everything_is_dropped():
    matcher = StopMatcher(["。"])
    assert matcher.feed("第一句。第二") == "第一句"
    assert matcher.feed("句。") == "" and matcher.flush() == ""


def test_empty_stop_strings_are_ignored():
    out, matcher = run_matcher(["", "STOP"], ["hello ", "there"])
    assert out == "hello there" and not matcher.stopped
    assert run_matcher([""], ["abc"])[0] == "abc"


def test_nested_stop_strings_cut_where_the_first_one_ends():
    """"b" ends before "abc" does: a stream sees it complete first, so does a whole text."""
    for pieces in (["abc"], ["a", "b", "c"], ["ab", "c"]):
        assert run_matcher(["abc", "b"], pieces)[0] == "a"


def splits(text: str):
    """Every way to cut `text` into non-empty pieces (2 ** (len - 1) of them)."""
    for mask in range(1 << max(len(text) - 1, 0)):
        cuts = [i + 1 for i in range(len(text) - 1) if mask >> i & 1]
        yield [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("text, stops, expected", [
    ("hello world", ["world", "lo"], "hel"),  # "lo" is complete first
    ("abc", ["abc", "b"], "a"),
    ("abc", ["bc", "abc"], ""),  # both complete at "c": cut before the one that starts first
    ("aab", ["ab"], "a"),  # a false start "a" must not hide the real one
    ("x</s>y</s>", ["</s>"], "x"),
    ("停停。好", ["停。", "。"], "停"),
    ("no stop here", ["zz", "herd"], "no stop here"),
    ("", ["a"], ""),
])
def test_every_split_of_a_text_gives_the_hand_written_cut(text, stops, expected):
    for pieces in splits(text):
        out, matcher = run_matcher(stops, pieces)
        assert out == expected, pieces
        assert matcher.stopped == (expected != text)


def first_stop_cut(text: str, stops: list[str]) -> str:
    """Brute force: read the text one character at a time; once some stop strings are complete,
    the output is what comes before the longest of them (the one that started first)."""
    for end in range(len(text) + 1):
        complete = [s for s in stops if text[:end].endswith(s)]
        if complete:
            return text[: end - max(map(len, complete))]
    return text


def test_any_split_of_the_text_gives_the_text_before_the_first_stop():
    """Stream a random text in random pieces: the output is the text cut where its first stop
    string to be completed starts, however the text was split."""
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice("ab停。") for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice("ab停。") for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, len(text))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        expected = first_stop_cut(text, stops)
        out, matcher = run_matcher(stops, pieces)
        assert out == expected, (text, stops, pieces)
        assert matcher.stopped == any(s in text for s in stops)


# --------------------------------------------------------------------------- TokenizerWorker


@pytest.fixture(scope="module")
def worker(smollm2_path):
    return TokenizerWorker(str(smollm2_path))


def test_worker_sends_a_tokenized_prompt_to_the_scheduler(worker, tok):
    params = SamplingParams(max_tokens=5)
    to_scheduler, to_frontend = worker.handle([TokenizeMsg(1, CHAT, params)])
    assert to_frontend == []
    [user] = to_scheduler
    assert isinstance(user, UserMsg) and user.uid == 1 and user.sampling_params == params
    assert user.input_ids.tolist() == TokenizeManager(tok).tokenize(CHAT).tolist()


def test_worker_answers_an_untokenizable_prompt_with_an_error_reply(worker):
    to_scheduler, to_frontend = worker.handle([TokenizeMsg(2, "", SamplingParams())])
    assert to_scheduler == []
    [reply] = to_frontend
    assert reply == UserReply(2, "", True, "the prompt is empty")


def test_worker_sends_detokenized_text_to_the_frontend(worker, tok):
    ids = tok("好").input_ids
    to_scheduler, to_frontend = worker.handle(
        [DetokenizeMsg(3, t, n == len(ids) - 1) for n, t in enumerate(ids)])
    assert to_scheduler == []
    assert [r.uid for r in to_frontend] == [3] * len(ids)
    assert "".join(r.incremental_output for r in to_frontend) == "好"
    assert to_frontend[-1].finished


def test_worker_forwards_aborts_in_order(worker):
    to_scheduler, _ = worker.handle([TokenizeMsg(4, "hi", SamplingParams()), AbortMsg(4),
                                     TokenizeMsg(5, "yo", SamplingParams())])
    assert [(type(m).__name__, m.uid) for m in to_scheduler] == \
        [("UserMsg", 4), ("AbortMsg", 4), ("UserMsg", 5)]


# --------------------------------------------------------------------------- the real process


def collect(queue: PullQueue, count: int) -> list:
    got: list = []
    while len(got) < count:
        message = queue.get(timeout_ms=30_000)
        assert message is not None, f"only {len(got)} of {count} messages arrived"
        got += unbatch(message)
    return got


def test_run_tokenizer_serves_in_its_own_process_and_exits_on_exit_msg(smollm2_path, tok):
    run_id = new_run_id()
    inbox, scheduler, frontend = (ipc_address(run_id, n) for n in ("tok", "sched", "front"))
    to_tokenizer = PushQueue(inbox, bind=False, encode=encode)
    from_tokenizer = PullQueue(scheduler, bind=True, decode=decode)
    replies = PullQueue(frontend, bind=True, decode=decode)
    children = Children()
    process = children.start("minisgl.tokenizer.worker:run_tokenizer", "tokenizer-0",
                             model_path=str(smollm2_path), inbox=inbox, bind_inbox=True,
                             scheduler=scheduler, frontend=frontend)
    try:
        assert children.wait_ready(timeout=120) == {"tokenizer-0": None}
        to_tokenizer.put(TokenizeMsg(1, CHAT, SamplingParams()))
        to_tokenizer.put(AbortMsg(1))
        user, abort = collect(from_tokenizer, 2)
        assert isinstance(user, UserMsg) and user.input_ids.dtype == torch.int32
        assert user.input_ids.tolist() == TokenizeManager(tok).tokenize(CHAT).tolist()
        assert abort == AbortMsg(1)  # after its request, never before

        ids = tok("你好，世界！").input_ids
        to_tokenizer.put(BatchMsg([DetokenizeMsg(2, t, n == len(ids) - 1)
                                   for n, t in enumerate(ids)]))
        answer = collect(replies, len(ids))
        assert "".join(r.incremental_output for r in answer) == "你好，世界！"
        assert [r.finished for r in answer] == [False] * (len(ids) - 1) + [True]

        to_tokenizer.put(TokenizeMsg(3, "", SamplingParams()))
        [error] = collect(replies, 1)
        assert error.uid == 3 and error.finished and "empty" in error.error
        assert from_tokenizer.get(timeout_ms=200) is None  # the bad prompt went nowhere else

        to_tokenizer.put(ExitMsg())
        process.join(timeout=30)
        assert process.exitcode == 0
    finally:
        children.stop()
        for q in (to_tokenizer, from_tokenizer, replies):
            q.close()


# --------------------------------------------------------------------------- utils.process


@contextmanager
def one_child(target: str, name: str,
              stop_timeout: float = 5.0) -> Iterator[tuple[BaseProcess, Children]]:
    """A child of process_targets started on Children of its own; stopped with
    stop(timeout=stop_timeout) when the block ends."""
    children = Children()
    process = children.start(f"process_targets:{target}", name)
    try:
        yield process, children
    finally:
        children.stop(timeout=stop_timeout)


def test_wait_ready_returns_each_childs_info_by_name():
    children = Children()
    for i in range(2):
        children.start("process_targets:ready_then_sleep", f"child-{i}")
    try:
        infos = children.wait_ready(timeout=60)
        assert infos == {p.name: p.pid for p in children.processes}
    finally:
        children.stop()
    assert all(p.exitcode == -signal.SIGTERM for p in children.processes)


def test_a_child_that_was_ready_and_has_ended_is_not_dead_to_a_later_wait():
    with one_child("report_start_up", "done") as (process, children):  # returns once ready
        children.wait_ready(timeout=60)
        process.join(timeout=30)
        children.start("process_targets:ready_late", "late")
        assert set(children.wait_ready(timeout=60)) == {"done", "late"}


def test_wait_ready_names_a_child_that_raises_while_starting():
    with one_child("raise_while_starting", "loader") as (_, children):
        with pytest.raises(RuntimeError, match="loader failed while starting") as info:
            children.wait_ready(timeout=60)
        assert "FileNotFoundError: no checkpoint at /nowhere/model" in str(info.value)


def test_wait_ready_names_a_child_whose_target_cannot_be_imported():
    with one_child("no_such_target", "typo") as (_, children):
        with pytest.raises(RuntimeError, match="typo failed while starting") as info:
            children.wait_ready(timeout=60)
        assert "AttributeError" in str(info.value) and "no_such_target" in str(info.value)


def test_wait_ready_names_a_child_that_exits_without_reporting():
    with one_child("exit_without_reporting", "silent") as (_, children):
        with pytest.raises(RuntimeError, match="silent exited with code 3 before it was ready"):
            children.wait_ready(timeout=60)


def test_children_ignore_ctrl_c():
    with one_child("ready_then_sleep", "worker") as (process, children):
        children.wait_ready(timeout=60)
        os.kill(process.pid, signal.SIGINT)
        process.join(timeout=1.0)
        assert process.exitcode is None  # still serving: the launcher decides when to stop it


def test_stop_kills_a_child_that_ignores_sigterm():
    with one_child("ignore_sigterm", "stubborn", stop_timeout=0.0) as (process, children):
        children.wait_ready(timeout=60)
        start = time.monotonic()
        children.stop(timeout=1.0)
        assert process.exitcode == -signal.SIGKILL  # SIGTERM was ignored; SIGKILL cannot be
        assert 1.0 <= time.monotonic() - start < 10.0


def test_stop_removes_the_runs_socket_files():
    run_id = new_run_id()
    left = ipc_address(run_id, "left-by-a-killed-child").removeprefix("ipc://")
    open(left, "w").close()
    with one_child("ready_then_sleep", "worker") as (_, children):
        children.run_id = run_id
        children.wait_ready(timeout=60)
    assert not os.path.exists(left)


def test_a_child_starts_from_the_preloaded_forkserver_in_little_cpu():
    # A spawned child would import torch itself: over a second of CPU on this kind of machine.
    with one_child("report_start_up", "light") as (_, children):
        info = children.wait_ready(timeout=60)["light"]
    assert info["cpu"] < 0.5, info


def test_a_child_sees_the_launchers_environment_as_it_is_when_the_child_starts(monkeypatch):
    # The forkserver keeps the environment it started with; the child must not.
    with one_child("report_start_up", "first") as (_, children):  # the forkserver is up
        children.wait_ready(timeout=60)
        monkeypatch.setenv("MINISGL_TEST_LATE_VARIABLE", "set later")
        children.start("process_targets:report_start_up", "second")
        info = children.wait_ready(timeout=60)["second"]
    assert info["env"] == "set later"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
def test_a_child_exits_when_its_parent_is_killed():
    launcher = (
        "import time\n"
        "from minisgl.utils.process import Children\n"
        "children = Children()\n"
        "children.start('process_targets:ready_then_sleep', 'orphan')\n"
        "print(children.wait_ready(timeout=60)['orphan'], flush=True)\n"
        "time.sleep(60)\n")
    # The launcher finds minisgl and process_targets where this test did, as a spawned child would.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, env=env,
                              text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert running(child)
        # The child, the forkserver that forked it and multiprocessing's resource tracker.
        everyone = descendants_of(parent.pid)
        assert child in everyone and len(everyone) == 3, everyone
        parent.kill()  # SIGKILL: the parent gets no chance to stop its children
        parent.wait()
        assert not wait_all_gone(everyone, timeout=5.0), "the launcher left processes running"
    finally:
        parent.kill()
        parent.wait()
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)


# --- the chapter's example ---

import ast  # noqa: E402
import re  # noqa: E402

from processes import run_example  # noqa: E402


def test_example_template_incremental_text_and_stop_strings(tok):
    out = run_example("ch13_tokenizer.py")
    chat = [{"role": "user", "content": "用一句话介绍大海。"}]
    template = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert f"模板展开后：\n{template}" in out
    ids = tok(template, add_special_tokens=False).input_ids  # the template has its specials
    assert f"共 {len(ids)} 个 token，最后 5 个：{ids[-5:]}" in out
    # Incremental detokenizing by hand: after each token, the decoded prefix without its
    # trailing replacement characters (bytes of a character still incomplete) grows by exactly
    # what the detokenizer should emit.
    text = "海水是咸的，🐟也是。"
    rows = re.findall(r"^  token +(\d+) +单独解码 .* 吐出 (.*)$", out, re.M)
    expected_ids, expected, done = tok(text).input_ids, [], ""
    for n in range(1, len(expected_ids) + 1):
        stable = tok.decode(expected_ids[:n]).rstrip("\ufffd")
        assert stable.startswith(done)
        expected.append(stable[len(done):])
        done = stable
    assert [int(t) for t, _ in rows] == expected_ids
    assert [ast.literal_eval(piece) for _, piece in rows] == expected
    assert f"拼起来： {text} ｜与原文相同： True" in out
    assert f"遇到停止串 '，' 截断后：{text.split('，')[0]!r}（stopped=True）" in out
    # 'Paris</ans' may be the start of '</answer>': the longest such tail is held back.
    fragment, stop = "Paris</ans", "</answer>"
    held = next(fragment[i:] for i in range(len(fragment)) if stop.startswith(fragment[i:]))
    assert (f"片段 'Paris</ans' 先吐出： {fragment[: -len(held)]!r} ，扣住的尾巴： {held!r}"
            in out)
    assert f"流结束时 flush 放出： {held!r}" in out
