#!/usr/bin/env python3
"""Official citations in the book: parse them, find stray line numbers, check them.

A citation of the official mini-sglang is written `[[PATH:START[-END] SYMBOL]]` or
`[[PATH:START[-END] "STATEMENT"]]`. PATH is relative to the official `python/minisgl/`, or to the
repository root when it starts with `/`. A line number written any other way ("第 73 行", "L73")
cannot be checked, so it is reported as a stray number. With `--official PATH` (a git directory or
clone holding PINNED_COMMIT) every citation is checked against the pinned source:

    python tools/citations.py [--official PATH] [PAGES...]

book/hooks.py imports this file to render the citations and to take PINNED_COMMIT.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PINNED_COMMIT = "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66"
SHORT_COMMIT = PINNED_COMMIT[:7]
OFFICIAL_REPO_URL = "https://github.com/sgl-project/mini-sglang"
PACKAGE_DIR = "python/minisgl/"
REPO_ROOT = Path(__file__).resolve().parent.parent

# The statement form is tried first and ends at the first `"]]`, so the quoted text may itself
# contain quotes and brackets. Symbols are dotted names; `::` and `~` admit C++ names.
CITATION = re.compile(
    r"\[\[(?P<path>/?[\w.\-]+(?:/[\w.\-]+)*):(?P<start>\d+)(?:-(?P<end>\d+))?"
    r" (?:\"(?P<statement>.+?)\"|(?P<symbol>[A-Za-z_~][\w.:~]*))\]\]"
)
OPEN = "[["

# Ways of writing an official line number that the checker cannot verify. `第 N 行` with ranges
# and lists (第 91～98 行, 第 39、42 行); `#L73` (a GitHub anchor); `L73` with two or more digits or
# a range (single-digit L1/L2 usually mean cache levels or norms); "line 73" / "lines 91-98".
# Boundaries are spelled out as ASCII look-arounds: `\b` sees no boundary between a CJK character
# and a Latin one, so "见L73行" would slip through it.
_NOT_BEFORE, _NOT_AFTER = r"(?<![A-Za-z0-9_#])", r"(?![A-Za-z0-9_])"
STRAY = re.compile(
    r"第\s*\d+(?:\s*[～~\-–—、,，和与及至到]\s*(?:第\s*)?\d+)*\s*行"
    r"|#L\d+(?:-L\d+)?"
    rf"|{_NOT_BEFORE}L\d+\s*[-–～~]\s*L?\d+{_NOT_AFTER}|{_NOT_BEFORE}L\d{{2,}}{_NOT_AFTER}"
    r"|(?<![A-Za-z])[Ll]ines?\s+\d+(?:\s*[-–～~]\s*\d+)?"
)
# A sentence that mentions the official repository. Stray numbers are looked for only in such
# sentences (and in the 官方实现对照 section), because elsewhere "第 0～4 行" is a row of a
# tensor or of a page table, which the book talks about all the time.
OFFICIAL_MENTION = re.compile(r"官方|sgl-project|" + SHORT_COMMIT)
SENTENCE_END = re.compile(r"(?<=[。！？；!?;|])")
OFFICIAL_SECTION = re.compile(r"^## .*官方实现对照")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
BACKTICKS = re.compile(r"`+")


@dataclass(frozen=True)
class Citation:
    page: str
    line: int
    text: str  # the raw `[[...]]`
    path: str
    start: int
    end: int  # equal to start for a one-line citation
    symbol: str | None
    statement: str | None

    @property
    def repo_path(self) -> str:
        """The path inside the official repository."""
        return self.path[1:] if self.path.startswith("/") else PACKAGE_DIR + self.path

    @property
    def url(self) -> str:
        lines = f"L{self.start}" if self.end == self.start else f"L{self.start}-L{self.end}"
        return f"{OFFICIAL_REPO_URL}/blob/{PINNED_COMMIT}/{self.repo_path}#{lines}"


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    citation: str  # the citation or the stray text the problem is about
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.citation}: {self.why}"


class OfficialCheckoutError(Exception):
    """The checkout given with --official cannot be used (not a git dir, commit missing)."""


# --------------------------------------------------------------------------- scanning pages


def fenced_lines(lines: Sequence[str]) -> list[bool]:
    """Mark the lines that belong to a fenced code block (fences included).

    Code blocks hold Python lists such as `[[1, 0], ...]` and program output; neither is a
    citation. Fences may be indented (inside admonitions and lists).
    """
    marks: list[bool] = []
    fence: str | None = None
    for line in lines:
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
            marks.append(fence is not None)
        else:
            marks.append(True)
            # A closing fence is the same character, at least as long, and nothing after it.
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                    and not line.strip().lstrip(fence[0]):
                fence = None
    return marks


def code_spans(line: str) -> list[tuple[int, int]]:
    """The [start, end) ranges of inline code spans on one line (`x`, ``x``)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while (match := BACKTICKS.search(line, pos)) is not None:
        ticks = match.group(0)
        close = re.compile(rf"(?<!`){ticks}(?!`)").search(line, match.end())
        if close is None:  # an unmatched run is literal text
            pos = match.end()
            continue
        spans.append((match.start(), close.end()))
        pos = close.end()
    return spans


def _inside(pos: int, spans: Iterable[tuple[int, int]]) -> bool:
    return any(start <= pos < end for start, end in spans)


@dataclass(frozen=True)
class Token:
    """A `[[` outside code: a citation, or malformed (citation is None) with the reason."""

    start: int
    end: int
    citation: Citation | None
    why: str = ""


def scan_line(line: str, page: str = "", lineno: int = 0) -> list[Token]:
    """Every `[[` on a prose line (outside inline code), parsed or reported as malformed."""
    tokens: list[Token] = []
    spans = code_spans(line)
    pos = 0
    while (at := line.find(OPEN, pos)) >= 0:
        if _inside(at, spans):
            pos = at + len(OPEN)
            continue
        match = CITATION.match(line, at)
        if match is None:
            close = line.find("]]", at)
            end = close + 2 if close >= 0 else len(line)
            tokens.append(Token(at, end, None, _malformed_reason(line[at:end])))
            pos = end
            continue
        start = int(match.group("start"))
        end = int(match.group("end") or start)
        citation = Citation(page, lineno, match.group(0), match.group("path"), start, end,
                            match.group("symbol"), match.group("statement"))
        why = ""
        if start < 1:
            why = "line numbers start at 1"
        elif end < start:
            why = f"range {start}-{end} ends before it starts"
        elif citation.statement is not None and not citation.statement.strip():
            why = "empty statement text"
        tokens.append(Token(at, match.end(), None if why else citation, why))
        pos = match.end()
    return tokens


def _malformed_reason(text: str) -> str:
    if not text.endswith("]]"):
        return 'no closing "]]" on this line'
    if ":" not in text:
        return "no :START line number after the path"
    if re.search(r":\d+[–—～~]\d+", text):
        return "write the range START-END with an ASCII hyphen"
    return 'expected [[PATH:START[-END] SYMBOL]] or [[PATH:START[-END] "STATEMENT"]]'


def scan_page(text: str, page: str) -> tuple[list[Citation], list[Problem]]:
    """The citations of one page, and its syntax and stray-line-number problems."""
    lines = text.split("\n")
    citations: list[Citation] = []
    problems: list[Problem] = []
    in_section = False
    for lineno, (line, fenced) in enumerate(zip(lines, fenced_lines(lines)), start=1):
        if fenced:
            continue
        if line.startswith("## "):
            in_section = bool(OFFICIAL_SECTION.match(line))
        prose = list(line)  # the line with citations blanked out, for the stray search
        for token in scan_line(line, page, lineno):
            if token.citation is None:
                problems.append(Problem(page, lineno, line[token.start:token.end],
                                        f"malformed citation: {token.why}"))
            else:
                citations.append(token.citation)
            prose[token.start:token.end] = " " * (token.end - token.start)
        for stray in stray_numbers("".join(prose), in_section):
            problems.append(Problem(page, lineno, stray, "official line number outside a "
                                    "citation; write it as [[PATH:START-END SYMBOL]]"))
    return citations, problems


def stray_numbers(line: str, in_official_section: bool) -> list[str]:
    """Line-number patterns that are (probably) official line numbers.

    Inside the 官方实现对照 section every such pattern counts. Elsewhere only the sentences that
    mention the official repository count; a table row's cells count as sentences.
    """
    if in_official_section:
        return [m.group(0) for m in STRAY.finditer(line)]
    if not OFFICIAL_MENTION.search(line):
        return []
    found: list[str] = []
    for sentence in SENTENCE_END.split(line):
        if OFFICIAL_MENTION.search(sentence):
            found.extend(m.group(0) for m in STRAY.finditer(sentence))
    return found


# --------------------------------------------------------------------------- the official source


class OfficialSource:
    """Files of PINNED_COMMIT read from a git directory with `git show`."""

    def __init__(self, git_dir: Path, commit: str = PINNED_COMMIT) -> None:
        self.git_dir = git_dir
        self.commit = commit
        self._files: dict[str, str | None] = {}
        probe = self._git("cat-file", "-e", f"{commit}^{{commit}}")
        if probe.returncode != 0:
            raise OfficialCheckoutError(
                f"commit {commit} is not in {git_dir} "
                f"(fetch it there: git -C {git_dir} fetch origin {commit})"
                + (f"; git says: {probe.stderr.strip()}" if probe.stderr.strip() else ""))

    def _git(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(self.git_dir), *args],
                              capture_output=True, text=True)

    def read(self, repo_path: str) -> str | None:
        """The file's text at the commit, or None when it does not exist there."""
        if repo_path not in self._files:
            shown = self._git("show", f"{self.commit}:{repo_path}")
            self._files[repo_path] = shown.stdout if shown.returncode == 0 else None
        return self._files[repo_path]


def _first_line(node: ast.stmt) -> int:
    # A decorated definition starts at its first decorator, as a reader sees it.
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _names(node: ast.stmt) -> list[str]:
    """The names a statement defines at its own level (def, class, assignment)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    names: list[str] = []
    for target in targets:
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        names.extend(e.id for e in elements if isinstance(e, ast.Name))
    return names


def _level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of one scope, looking through if/try/with blocks (not into functions)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.With, ast.AsyncWith)):
            yield from _level(node.body)
            yield from _level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            yield from _level(node.body)
            for handler in node.handlers:
                yield from _level(handler.body)
            yield from _level(node.orelse)
            yield from _level(node.finalbody)


def resolve(tree: ast.Module, dotted: str) -> tuple[list[ast.stmt], str]:
    """All definitions of a dotted name (module → class → member), or [] and why not."""
    scopes: list[list[ast.stmt]] = [tree.body]
    found: list[ast.stmt] = []
    where = "at module level"
    for depth, part in enumerate(dotted.split(".")):
        found = [node for body in scopes for node in _level(body) if part in _names(node)]
        if not found:
            return [], f"no `{part}` {where}"
        if depth < dotted.count("."):
            classes = [node for node in found if isinstance(node, ast.ClassDef)]
            if not classes:
                return [], f"`{part}` is not a class, so it has no `{dotted.split('.')[depth + 1]}`"
            scopes = [c.body for c in classes]
            where = f"in class `{part}`"
    return found, ""


def _innermost(tree: ast.Module, line: int) -> tuple[str, int] | None:
    """The innermost def/class containing a line: its name and last line."""
    best: tuple[int, str, int] | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first, last = _first_line(node), node.end_lineno or node.lineno
            if first <= line <= last and (best is None or last - first < best[0]):
                best = (last - first, node.name, last)
    return None if best is None else (best[1], best[2])


def check_citation(citation: Citation, source: OfficialSource) -> str | None:
    """Why the citation does not match the official source, or None when it does."""
    text = source.read(citation.repo_path)
    if text is None:
        return f"no file {citation.repo_path} at {source.commit[:7]}"
    # Split on "\n" only, as git, GitHub and ast number lines (splitlines() also breaks on \f).
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if citation.end > len(lines):
        return f"line {citation.end} is past the end of the file ({len(lines)} lines)"
    is_python = citation.repo_path.endswith(".py")
    tree: ast.Module | None = None
    if is_python:
        try:
            tree = ast.parse(text)
        except SyntaxError as error:
            return f"cannot parse {citation.repo_path}: {error}"
    start_line = lines[citation.start - 1]

    if citation.statement is not None:
        wanted = citation.statement.strip()
        if wanted not in start_line:
            return f"statement not on line {citation.start}, which reads: {start_line.strip()!r}"
        if tree is not None and (inner := _innermost(tree, citation.start)) is not None:
            name, last = inner
            if citation.end > last:
                return f"ends at line {citation.end}, past the end of `{name}` (line {last})"
        return None

    assert citation.symbol is not None
    if tree is None:  # .cu, .cpp, .toml ...: the symbol text must be on the start line
        if citation.symbol not in start_line:
            return (f"`{citation.symbol}` is not on line {citation.start}, which reads: "
                    f"{start_line.strip()!r}")
        return None
    nodes, why = resolve(tree, citation.symbol)
    if not nodes:
        return f"`{citation.symbol}` not found in {citation.path}: {why}"
    spans = [(_first_line(n), n.end_lineno or n.lineno) for n in nodes]
    for first, last in spans:
        if first == citation.start:
            if citation.end > last:
                return (f"ends at line {citation.end}, past the end of `{citation.symbol}` "
                        f"(line {last})")
            return None
    where = ", ".join(f"{first}-{last}" for first, last in spans)
    return (f"starts at line {citation.start}, but `{citation.symbol}` is at lines {where} "
            "(a range must start at its first decorator, def/class or assignment line)")


# --------------------------------------------------------------------------- pages and CLI


def default_pages(root: Path = REPO_ROOT) -> list[Path]:
    return sorted((root / "book").glob("*.md"))


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def check_pages(pages: Sequence[Path], source: OfficialSource | None = None,
                root: Path = REPO_ROOT) -> tuple[list[Citation], list[Problem]]:
    """Scan the pages; with a source, also check every citation against it."""
    citations: list[Citation] = []
    problems: list[Problem] = []
    for path in pages:
        page_citations, page_problems = scan_page(path.read_text(encoding="utf-8"),
                                                  _display(path, root))
        citations += page_citations
        problems += page_problems
    if source is not None:
        for citation in citations:
            why = check_citation(citation, source)
            if why is not None:
                problems.append(Problem(citation.page, citation.line, citation.text, why))
    problems.sort(key=lambda p: (p.page, p.line))
    return citations, problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, metavar="PATH",
                        help=f"git directory or clone of the official repository holding "
                             f"{SHORT_COMMIT}; without it, only syntax and stray numbers "
                             "are checked")
    parser.add_argument("pages", nargs="*", type=Path, help="book pages (default: book/*.md)")
    args = parser.parse_args(argv)
    pages = args.pages or default_pages()
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        print(f"citations: no such page: {', '.join(missing)}", file=sys.stderr)
        return 2
    source = None
    if args.official is not None:
        try:
            source = OfficialSource(args.official)
        except OfficialCheckoutError as error:
            print(f"citations: {error}", file=sys.stderr)
            return 2
    citations, problems = check_pages(pages, source)
    for problem in problems:
        print(problem)
    head = f"{len(citations)} citations in {len(pages)} pages"
    if problems:
        unchecked = "" if source else " (the official check did not run: no checkout given)"
        print(f"{head}: {len(problems)} problems{unchecked}")
    elif source is not None:
        print(f"{head}: all match {SHORT_COMMIT}")
    else:
        print(f"{head}: syntax ok, no stray line numbers; the official check did not run "
              f"(no checkout given: pass --official PATH)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
