"""tools/citations.py and the book hook's rendering of official citations.

The rules are checked against a small fake official repository made with `git init`; the real
pages are checked for syntax and stray line numbers (no checkout needed), and against the real
official repository only when MINISGL_OFFICIAL points to a checkout of it.
"""

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


citations = _load("citations_tool", ROOT / "tools" / "citations.py")

# The fake official file; each definition's line is found by its text so the test reads clearly.
CORE = '''"""A fake core module."""
from dataclasses import dataclass

LIMIT = 4
MAX_LEN: int = 8


@dataclass
class Req:
    uid: int
    cached_len: int = 0

    @property
    def extend_len(self) -> int:
        return self.uid - self.cached_len

    def step(self) -> None:
        torch.manual_seed(42)
        self.uid += 1


def helper(x):
    return x
'''
STORE_CU = """#include <cuda.h>

__global__ void store_kv_cache(int *out) {
  out[0] = 1;
}
"""
BENCH = "def main():\n    pass\n"


def line_of(text: str, source: str = CORE) -> int:
    """The 1-based line of the first line of `source` containing `text`."""
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """A fake official repository with one commit; returns an OfficialSource at that commit."""
    repo = tmp_path_factory.mktemp("official")
    _git(repo, "init", "-q")
    for path, text in {"python/minisgl/core.py": CORE,
                       "python/minisgl/kernel/store.cu": STORE_CU,
                       "benchmark/bench.py": BENCH}.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fake")
    return citations.OfficialSource(repo, _git(repo, "rev-parse", "HEAD"))


def cite(text: str):
    tokens = citations.scan_line(text, "page.md", 1)
    assert len(tokens) == 1 and tokens[0].citation is not None, tokens
    return tokens[0].citation


def check(text: str, source) -> str | None:
    return citations.check_citation(cite(text), source)


# --------------------------------------------------------------------------- parsing


def test_parses_symbol_and_statement_forms_with_their_line():
    page = ("# t\n\n见 [[kvcache/radix_cache.py:205-230 RadixPrefixCache._tree_walk]] 和\n"
            '[[engine/config.py:29 "use_pynccl: bool = True"]]，'
            "[[/benchmark/offline/bench.py:1-40 main]]\n")
    found, problems = citations.scan_page(page, "book/x.md")
    assert problems == []
    walk, seed, bench = found
    assert (walk.line, walk.path, walk.start, walk.end, walk.symbol) == \
        (3, "kvcache/radix_cache.py", 205, 230, "RadixPrefixCache._tree_walk")
    assert (seed.line, seed.start, seed.end, seed.statement, seed.symbol) == \
        (4, 29, 29, "use_pynccl: bool = True", None)
    assert bench.repo_path == "benchmark/offline/bench.py"
    assert walk.repo_path == "python/minisgl/kvcache/radix_cache.py"
    assert walk.url.endswith(f"/blob/{citations.PINNED_COMMIT}/python/minisgl/"
                             "kvcache/radix_cache.py#L205-L230")
    assert seed.url.endswith("engine/config.py#L29")


def test_statement_may_hold_quotes_and_brackets():
    assert cite('[[a.py:3 "x["k"] = [1]"]]').statement == 'x["k"] = [1]'


@pytest.mark.parametrize("text", [
    "[[core.py:15–25 Req]]",     # en dash
    "[[core.py Req]]",           # no line
    "[[core.py:15-25]]",         # no symbol
    "[[core.py:15-25 Req",       # not closed
    "[[core.py:25-15 Req]]",     # backwards
    "[[core.py:0 Req]]",
])
def test_malformed_citations_are_problems(text):
    _, problems = citations.scan_page(f"见 {text} 。", "book/x.md")
    assert len(problems) == 1 and problems[0].why.startswith("malformed citation")


def test_code_is_not_scanned():
    page = "```text\nA = [[1, 0],\n     [0, 1]]\n第 3 行 官方\n```\n`[[a` 与 ``b [[c``\n"
    assert citations.scan_page(page, "book/x.md") == ([], [])


# --------------------------------------------------------------------------- stray line numbers


SECTION = "## 官方实现对照\n\n{}\n\n## 测试与运行结果\n\n{}\n"


@pytest.mark.parametrize("stray", ["第 73 行", "第 91～98 行", "第 91-98 行", "第 39、42 行",
                                   "L73", "L5-L9", "line 73", "lines 91-98", "的L73行", "见line 7",
                                   "[链接](https://github.com/sgl-project/x/blob/y/a.py#L7)"])
def test_stray_numbers_in_the_official_section_are_reported(stray):
    _, problems = citations.scan_page(SECTION.format(f"见 `a.py` {stray}。", ""), "book/x.md")
    assert [p.line for p in problems] == [3]


def test_stray_numbers_elsewhere_only_in_sentences_about_the_official_code():
    text = ("K、V 写进第 0～4 行，读出第 0～9 行。官方在 `engine/engine.py` 第 199～200 行做这件事。"
            "第 3 章讲模型，L2 缓存与第 5 个 token 无关。")
    _, problems = citations.scan_page(SECTION.format("", text), "book/x.md")
    assert [(p.line, p.citation) for p in problems] == [(7, "第 199～200 行")]


def test_rows_and_chapters_without_the_official_code_are_not_stray():
    text = "LM head 取第 4 行和第 5 行；rank 0 持有第 0～4 行，第 16 章再讲。"
    assert citations.scan_page(SECTION.format("", text), "book/x.md") == ([], [])


def test_a_citation_is_not_a_stray_number():
    text = "官方的 [[core.py:28-68 Req]] 有 cached_len。"
    found, problems = citations.scan_page(SECTION.format(text, text), "book/x.md")
    assert len(found) == 2 and problems == []


# --------------------------------------------------------------------------- the official check


def test_definitions_accept_ranges_that_start_at_them(official):
    req, helper = line_of("@dataclass"), line_of("def helper")
    assert check(f"[[core.py:{req}-{line_of('self.uid += 1')} Req]]", official) is None
    assert check(f"[[core.py:{req}-{req + 3} Req]]", official) is None  # head only
    assert check(f"[[core.py:{line_of('@property')}-{line_of('return self.uid')} "
                 "Req.extend_len]]", official) is None
    assert check(f"[[core.py:{line_of('def step')} Req.step]]", official) is None
    assert check(f"[[core.py:{line_of('cached_len: int')} Req.cached_len]]", official) is None
    assert check(f"[[core.py:{line_of('LIMIT')} LIMIT]]", official) is None
    assert check(f"[[core.py:{line_of('MAX_LEN')} MAX_LEN]]", official) is None
    assert check(f"[[core.py:{helper}-{helper + 1} helper]]", official) is None


def test_start_must_be_the_first_decorator_or_def_line(official):
    why = check(f"[[core.py:{line_of('class Req')} Req]]", official)
    assert why is not None and "starts at line" in why
    why = check(f"[[core.py:{line_of('def extend_len')} Req.extend_len]]", official)
    assert why is not None and "starts at line" in why


def test_end_must_not_pass_the_definition(official):
    helper = line_of("def helper")
    why = check(f"[[core.py:{line_of('@dataclass')}-{helper} Req]]", official)
    assert why is not None and "past the end of `Req`" in why


def test_missing_file(official):
    why = check("[[nope.py:1 x]]", official)
    assert why is not None and "no file python/minisgl/nope.py" in why


def test_range_past_the_end_of_the_file(official):
    helper = line_of("def helper")
    why = check(f"[[core.py:{helper}-{helper + 5} helper]]", official)
    assert why is not None and "past the end of the file" in why


@pytest.mark.parametrize("name", ["Req.missing", "missing", "LIMIT.x"])
def test_dotted_name_not_found(official, name):
    why = check(f"[[core.py:1 {name}]]", official)
    assert why is not None and "not found" in why


def test_statement_must_be_on_the_start_line(official):
    seed = line_of("manual_seed")
    assert check(f'[[core.py:{seed} "torch.manual_seed(42)"]]', official) is None
    assert check(f'[[core.py:{seed} "  torch.manual_seed(42) "]]', official) is None
    why = check(f'[[core.py:{seed + 1} "torch.manual_seed(42)"]]', official)
    assert why is not None and "statement not on line" in why


def test_statement_range_stays_inside_the_innermost_definition(official):
    seed = line_of("manual_seed")
    assert check(f'[[core.py:{seed}-{seed + 1} "manual_seed"]]', official) is None
    why = check(f'[[core.py:{seed}-{seed + 2} "manual_seed"]]', official)
    assert why is not None and "past the end of `step`" in why


def test_other_files_need_the_symbol_on_the_start_line(official):
    kernel = line_of("store_kv_cache", STORE_CU)
    assert check(f"[[kernel/store.cu:{kernel}-{kernel + 2} store_kv_cache]]", official) is None
    why = check(f"[[kernel/store.cu:{kernel + 1} store_kv_cache]]", official)
    assert why is not None and "is not on line" in why


def test_a_leading_slash_is_the_repository_root(official):
    assert check("[[/benchmark/bench.py:1-2 main]]", official) is None
    assert "no file" in check("[[benchmark/bench.py:1 main]]", official)


def test_a_checkout_without_the_commit_fails_clearly(official, tmp_path):
    with pytest.raises(citations.OfficialCheckoutError, match="is not in"):
        citations.OfficialSource(official.git_dir, "0" * 40)
    with pytest.raises(citations.OfficialCheckoutError, match="is not in"):
        citations.OfficialSource(tmp_path)


def test_cli_without_a_checkout_says_the_check_did_not_run(tmp_path, capsys):
    good, bad = tmp_path / "good.md", tmp_path / "bad.md"
    good.write_text("官方的 [[core.py:28-68 Req]]。\n")
    bad.write_text("官方的 `core.py` 第 28～68 行。\n")
    assert citations.main([str(good)]) == 0
    assert "did not run (no checkout given" in capsys.readouterr().out
    assert citations.main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:1: 第 28～68 行: official line number" in out and "1 problems" in out


# --------------------------------------------------------------------------- the hook


@pytest.fixture(scope="module")
def hooks():
    pytest.importorskip("mkdocs")
    return _load("book_hooks", ROOT / "book" / "hooks.py")


def test_hook_renders_a_symbol_citation_as_a_link(hooks):
    text = "见 [[kvcache/radix_cache.py:205-230 RadixPrefixCache._tree_walk]]。"
    out = hooks.render_citations(text, "x.md", citations)
    assert out == ("见 [`kvcache/radix_cache.py` · `RadixPrefixCache._tree_walk` · 第 205–230 行]"
                   f"(https://github.com/sgl-project/mini-sglang/blob/{citations.PINNED_COMMIT}"
                   "/python/minisgl/kvcache/radix_cache.py#L205-L230)。")


def test_hook_renders_a_statement_and_a_single_line(hooks):
    text = '[[engine/engine.py:37 "torch.manual_seed(42)"]]'
    out = hooks.render_citations(text, "x.md", citations)
    assert out.startswith("[`engine/engine.py` · `torch.manual_seed(42)` · 第 37 行](")
    assert out.endswith("/python/minisgl/engine/engine.py#L37)")
    assert "`` `a` ``" in hooks.render_citations('[[x.py:1 "`a`"]]', "x.md", citations)


def test_hook_leaves_code_alone(hooks):
    page = "```text\nA = [[1, 0],\n```\n`[[x.py:1 f]]`\n"
    assert hooks.render_citations(page, "x.md", citations) == page


def test_hook_fails_the_build_on_a_malformed_citation(hooks):
    with pytest.raises(hooks.PluginError, match=r"ch09_radix_cache\.md:2: malformed citation"):
        hooks.render_citations("ok\n见 [[core.py:15–25 Req]]\n", "ch09_radix_cache.md", citations)


# --------------------------------------------------------------------------- the real pages


PAGES = citations.default_pages(ROOT)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_has_valid_citations_and_no_stray_line_numbers(page):
    _, problems = citations.scan_page(page.read_text(encoding="utf-8"), page.name)
    assert problems == [], "\n".join(map(str, problems))


def test_pages_match_the_official_source():
    checkout = os.environ.get("MINISGL_OFFICIAL")
    if not checkout:
        pytest.skip("set MINISGL_OFFICIAL to a checkout of sgl-project/mini-sglang "
                    f"holding {citations.SHORT_COMMIT} to check citations against it")
    source = citations.OfficialSource(Path(checkout))
    found, problems = citations.check_pages(PAGES, source, ROOT)
    assert problems == [], "\n".join(map(str, problems))
