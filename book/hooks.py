"""MkDocs hook: expand step markers into output generated from the real chapter snapshots.

A line `<!-- steps:tree N -->` becomes a ```text block with `render_tree(root, N)`, and
`<!-- steps:diff N -->` a ```diff block with `render_diff(root, N)`, both from tools/steps.py.
The book therefore never holds a pasted copy of a tree or a diff that could go stale.

An official citation `[[kvcache/radix_cache.py:205-230 RadixPrefixCache._tree_walk]]` becomes a
link to that file and range at the pinned commit, written as
`kvcache/radix_cache.py` · `RadixPrefixCache._tree_walk` · 第 205–230 行. The parsing and the
pinned commit come from tools/citations.py, which also checks each citation against the official
source; a malformed `[[` fails the build so it cannot reach the site as raw text.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mkdocs.exceptions import PluginError

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

MARKER = re.compile(r"^<!-- steps:(tree|diff) (\d+) -->[ \t]*$", re.MULTILINE)
LANGUAGE = {"tree": "text", "diff": "diff"}


def _load_tool(root: Path, name: str) -> ModuleType:
    path = root / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_book_{name}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise PluginError(f"book/hooks.py: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def _fence(language: str, body: str) -> str:
    # A fence longer than any backtick run inside the body, so a diff of Markdown stays intact.
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{language}\n{body.rstrip()}\n{ticks}"


def _code(text: str) -> str:
    # An inline code span that survives backticks inside the text (a quoted statement may hold one).
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def render_citation(citation: Any) -> str:
    """The Markdown link for one parsed citation (a tools/citations.py Citation)."""
    lines = (f"第 {citation.start} 行" if citation.end == citation.start
             else f"第 {citation.start}–{citation.end} 行")
    what = citation.symbol if citation.statement is None else citation.statement.strip()
    return f"[{_code(citation.path)} · {_code(what)} · {lines}]({citation.url})"


def render_citations(markdown: str, src_path: str, citations: ModuleType) -> str:
    """Replace every citation outside code with its link; a malformed one raises PluginError."""
    lines = markdown.split("\n")
    for index, fenced in enumerate(citations.fenced_lines(lines)):
        if fenced or "[[" not in lines[index]:
            continue
        line, out, pos = lines[index], [], 0
        for token in citations.scan_line(line, src_path, index + 1):
            if token.citation is None:
                raise PluginError(f"{src_path}:{index + 1}: malformed citation "
                                  f"{line[token.start:token.end]!r}: {token.why}")
            out += [line[pos:token.start], render_citation(token.citation)]
            pos = token.end
        lines[index] = "".join(out) + line[pos:]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    root = Path(config.config_file_path).resolve().parent
    if "[[" in markdown:
        # Loaded per page, like steps.py, so `mkdocs serve` picks up edits to the tool.
        markdown = render_citations(markdown, page.file.src_path, _load_tool(root, "citations"))
    if not MARKER.search(markdown):
        return markdown
    steps = _load_tool(root, "steps")  # loaded per page so `mkdocs serve` picks up edits
    render = {"tree": steps.render_tree, "diff": steps.render_diff}

    def expand(match: re.Match[str]) -> str:
        kind, chapter = match.group(1), int(match.group(2))
        try:
            body: str = render[kind](root, chapter)
        except Exception as error:  # name the page and marker; the traceback follows
            raise PluginError(f"{page.file.src_path}: steps:{kind} {chapter} failed: {error}") \
                from error
        return _fence(LANGUAGE[kind], body if body.strip() else "（这一章没有改动任何包文件）")

    return MARKER.sub(expand, markdown)
