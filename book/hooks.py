"""MkDocs hook: expand step markers into output generated from the real chapter snapshots.

A line `<!-- steps:tree N -->` becomes a ```text block with `render_tree(root, N)`, and
`<!-- steps:diff N -->` a ```diff block with `render_diff(root, N)`, both from tools/steps.py.
The book therefore never holds a pasted copy of a tree or a diff that could go stale.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from mkdocs.exceptions import PluginError

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

MARKER = re.compile(r"^<!-- steps:(tree|diff) (\d+) -->[ \t]*$", re.MULTILINE)
LANGUAGE = {"tree": "text", "diff": "diff"}


def _load_steps(root: Path) -> ModuleType:
    path = root / "tools" / "steps.py"
    spec = importlib.util.spec_from_file_location("_book_steps", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise PluginError(f"book/hooks.py: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fence(language: str, body: str) -> str:
    # A fence longer than any backtick run inside the body, so a diff of Markdown stays intact.
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{language}\n{body.rstrip()}\n{ticks}"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if not MARKER.search(markdown):
        return markdown
    root = Path(config.config_file_path).resolve().parent
    steps = _load_steps(root)  # loaded per page so `mkdocs serve` picks up edits to steps.py
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
