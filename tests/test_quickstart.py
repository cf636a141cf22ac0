"""The chapter-0 quickstart (examples/ch00_quickstart.py), run as a reader runs it: the final
offline API on the default model, its texts against transformers' greedy ones."""

from __future__ import annotations

import ast
import re

from conftest import SMOLLM2
from processes import run_example

CHAPTER = None  # shows the final API (LLM.generate, chapter 11 on): runs only in `make test`


def test_quickstart_prints_transformers_greedy_texts(hf_model, hf_tokenizer, hf_greedy):
    out = run_example("ch00_quickstart.py", timeout=600)
    rows = [tuple(ast.literal_eval(s) for s in row)
            for row in re.findall(r"^('.*') -> ('.*')$", out, re.M)]
    assert [prompt for prompt, _ in rows] == ["The capital of France is",
                                              "List three prime numbers:", "def fibonacci(n):"]
    tokenizer, hf = hf_tokenizer(SMOLLM2), hf_model(SMOLLM2)
    for prompt, text in rows:  # SamplingParams(max_tokens=16, ignore_eos=True): greedy
        assert text == tokenizer.decode(hf_greedy(hf, tokenizer(prompt).input_ids, 16)), prompt
    assert rows[0][1].startswith(" Paris.")
    assert re.search(r"^3 个请求 × 16 个 token，.*用时 [\d.]+ 秒$", out, re.M)
