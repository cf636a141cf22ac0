"""Machine-checked exercises: a chapter's tree with one of its own functions taken out.

Each chapter lists its exercises in its chapter.toml:

    [[exercises]]
    name = "evict"                                  # what the reader types
    file = "kvcache/radix_cache.py"                 # under minisgl/, a file the chapter writes
    function = "RadixCache.evict"                   # a function, or Class.method
    tests = ["tests/test_radix_cache.py::test_evict_frees_the_least_recently_used_leaf_first"]
    task = "按最久未用的顺序淘汰未锁住的叶子，……"   # one line, Chinese: what to write

    [[exercises.mistakes]]                          # plausible wrong answers (any number)
    name = "parent_never_queued"
    what = "a parent left a leaf by its last child's eviction is never considered"
    old = "..."                                     # text of the chapter's function, found once
    new = "..."                                     # what replaces it (old/new: lists for more)

`steps.py exercise N NAME` builds chapter N (as `build` does) and replaces that function's body
(its docstring stays) with `raise NotImplementedError("练习：<task>")`; the reader makes the
named tests pass. `--solution` copies the chapter's own file back. The selection is by the
syntax tree, so the library code carries no markers. Neither overwrites what the reader wrote:
a tree whose files differ from what steps.py put there is refused unless `--force` is given.
The test command printed uses an interpreter that has the project installed.

tests/test_exercises.py checks each exercise both ways. With the body taken out, the named
tests must fail (not error, not skip) and their output must show the message of the
exercise's NotImplementedError. The solution is the chapter's file byte for byte, and
`steps.py check N` already runs the chapter's tests on that unmodified tree, so "the solution
passes" needs no second run. Each listed mistake, patched into the chapter's function, must
fail at least one of the named tests: an exercise names the tests that catch the usual wrong
answers.
"""

from __future__ import annotations

import ast
import filecmp
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import steps
from steps import PACKAGE, StepsError, find_chapter, format_table, overlay, tomllib

MARK = "练习："  # starts every taken-out body's error message


@dataclass(frozen=True)
class Mistake:
    """A plausible wrong answer: the chapter's function with a few pieces of its text replaced."""

    name: str
    what: str
    edits: tuple[tuple[str, str], ...]  # (old, new): old occurs once in the function


@dataclass(frozen=True)
class Exercise:
    chapter: int
    name: str
    file: str  # "minisgl/..." posix path
    function: str  # "name" or "Class.name"
    tests: tuple[str, ...]  # pytest node ids, relative to a built tree
    task: str
    mistakes: tuple[Mistake, ...] = ()

    @property
    def message(self) -> str:
        return MARK + self.task


def exercises(root: Path, spec: "str | int") -> list[Exercise]:
    """The exercises chapter.toml declares for a chapter, in their order there."""
    ch = find_chapter(root, spec)
    toml = ch.dir / "chapter.toml"
    meta = tomllib.loads(toml.read_text(encoding="utf-8")) if toml.is_file() else {}
    found = []
    for entry in meta.get("exercises", []):
        missing = {"name", "file", "function", "tests", "task"} - entry.keys()
        if missing:
            raise StepsError(f"{toml}: an exercise lacks {', '.join(sorted(missing))}")
        mistakes = tuple(_mistake(toml, entry["name"], m) for m in entry.get("mistakes", []))
        found.append(Exercise(ch.n, entry["name"], f"{PACKAGE}/{entry['file']}", entry["function"],
                              tuple(entry["tests"]), entry["task"], mistakes))
    return found


def _mistake(toml: Path, exercise: str, entry: dict) -> Mistake:
    missing = {"name", "what", "old", "new"} - entry.keys()
    if missing:
        raise StepsError(f"{toml}: a mistake of {exercise} lacks {', '.join(sorted(missing))}")
    old, new = entry["old"], entry["new"]
    old, new = ([old], [new]) if isinstance(old, str) else (old, new)
    if isinstance(new, str) or len(old) != len(new) or not old:
        raise StepsError(f"{toml}: mistake {entry['name']}: old and new must be two strings or "
                         f"two lists of the same length")
    return Mistake(entry["name"], entry["what"], tuple(zip(old, new)))


def find_exercise(root: Path, spec: "str | int", name: str) -> Exercise:
    known = exercises(root, spec)
    for ex in known:
        if ex.name == name:
            return ex
    raise StepsError(f"chapter {spec} has no exercise {name!r}; it has: "
                     f"{', '.join(ex.name for ex in known) or 'none'}")


def function_node(source: str, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The one def named qualname ("f" or "Class.f") at module or class level."""
    scope: ast.AST = ast.parse(source)
    *classes, name = qualname.split(".")
    for part in classes:
        scope = _only(scope, part, (ast.ClassDef,), qualname)
    return _only(scope, name, (ast.FunctionDef, ast.AsyncFunctionDef), qualname)


def _only(scope: ast.AST, name: str, kinds: tuple[type, ...], qualname: str):
    found = [n for n in getattr(scope, "body", []) if isinstance(n, kinds) and n.name == name]
    if len(found) != 1:  # a property with a setter would be two defs of one name
        raise StepsError(f"{qualname}: {len(found)} definitions named {name}, need exactly one")
    return found[0]


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    """1-based first and last line of the body after its docstring (what an exercise removes)."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        raise StepsError(f"{node.name} has nothing but a docstring to take out")
    if body[0].lineno == node.lineno:
        raise StepsError(f"{node.name} is written on its def line; give it a body of its own")
    return body[0].lineno, body[-1].end_lineno


def take_out(source: str, ex: Exercise) -> tuple[str, int]:
    """source with ex's function body replaced by the exercise's raise; and how many lines went."""
    node = function_node(source, ex.function)
    first, last = body_lines(node)
    lines = source.splitlines(keepends=True)
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    raise_line = f"{indent}raise NotImplementedError({ex.message!r})\n"
    return "".join(lines[: first - 1]) + raise_line + "".join(lines[last:]), last - first + 1


def make_mistake(source: str, ex: Exercise, mistake: Mistake) -> str:
    """source with mistake's edits made inside ex's function (and nowhere else)."""
    node = function_node(source, ex.function)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = source.splitlines(keepends=True)
    text = "".join(lines[first - 1 : node.end_lineno])
    for old, new in mistake.edits:
        if text.count(old) != 1:
            raise StepsError(f"{ex.function}, mistake {mistake.name}: {old!r} occurs "
                             f"{text.count(old)} times in the function, need once")
        text = text.replace(old, new)
    result = "".join(lines[: first - 1]) + text + "".join(lines[node.end_lineno :])
    try:
        changed = function_node(result, ex.function)
    except SyntaxError as e:
        raise StepsError(f"{ex.function}, mistake {mistake.name}: not Python: {e}") from None
    if ast.dump(changed) == ast.dump(node):
        raise StepsError(f"{ex.function}, mistake {mistake.name}: changes nothing")
    return result


def chapter_file(root: Path, ex: Exercise) -> Path:
    """The chapter's own version of the exercise's file (the solution)."""
    files = overlay(root, ex.chapter)
    if ex.file not in files:
        raise StepsError(f"chapter {ex.chapter} has no {ex.file}")
    return files[ex.file]


def prepare(root: Path, ex: Exercise, dest: Path) -> int:
    """Build chapter ex.chapter into dest with ex's body taken out; returns the lines removed."""
    steps.build(root, ex.chapter, dest)
    text, removed = take_out(chapter_file(root, ex).read_text(encoding="utf-8"), ex)
    (dest / ex.file).write_text(text, encoding="utf-8")
    return removed


def restore(root: Path, ex: Exercise, dest: Path) -> None:
    """Put the chapter's own file back (building dest first if it is not a tree yet)."""
    if not (dest / PACKAGE).is_dir():
        steps.build(root, ex.chapter, dest)
    shutil.copy2(chapter_file(root, ex), dest / ex.file)


# What `build` writes into a tree and a rebuild replaces (it removes the three directories).
BUILT = (PACKAGE, "tests", "examples", "main.py", "pytest.ini")
NOT_WORK = {"__pycache__", ".pytest_cache"}  # what running the tree leaves behind


def _files(top: Path) -> dict[str, Path]:
    """The files under top's BUILT entries, by posix path relative to top."""
    found = {}
    for entry in BUILT:
        path = top / entry
        if path.is_file():
            found[entry] = path
        elif path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = [d for d in dirnames if d not in NOT_WORK]
                for name in filenames:
                    if not name.endswith(".pyc"):
                        full = Path(dirpath) / name
                        found[full.relative_to(top).as_posix()] = full
    return found


def readers_work(root: Path, ex: Exercise, dest: Path, solution: bool) -> list[str]:
    """The files in dest that the command would overwrite or remove and that steps.py did not
    write as they are: the reader's work. The exercise's file may be either the taken-out or
    the chapter's version. --solution replaces that one file of a built tree; a fresh start
    (or --solution where no tree is built yet) builds the whole tree."""
    own = chapter_file(root, ex).read_text(encoding="utf-8")
    pristine = {own, take_out(own, ex)[0]}
    mine = dest / ex.file
    if solution and (dest / PACKAGE).is_dir():
        if mine.is_file() and mine.read_text(encoding="utf-8", errors="replace") not in pristine:
            return [ex.file]
        return []
    have = _files(dest)
    if not have:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        steps.build(root, ex.chapter, Path(tmp))
        fresh = _files(Path(tmp))
        changed = []
        for rel, path in sorted(have.items()):
            if rel == ex.file:
                same = path.read_text(encoding="utf-8", errors="replace") in pristine
            else:
                same = rel in fresh and filecmp.cmp(path, fresh[rel], shallow=False)
            if not same:
                changed.append(rel)
        return changed


def pytest_python(root: Path) -> Path:
    """The interpreter for the printed test command: this one if it can import torch (the
    project's dependencies are installed), else the repository's .venv if it has one. A new
    shell's `python` may be neither."""
    venv = root / ".venv" / "bin" / "python"
    if importlib.util.find_spec("torch") is None and venv.exists():
        return venv
    return Path(sys.executable)


def pytest_args(ex: Exercise) -> list[str]:
    return ["-m", "pytest", "-q", *ex.tests]


def pytest_command(root: Path, ex: Exercise, dest: Path) -> str:
    """`cd DEST && PYTHON -m pytest -q TESTS`, PYTHON relative to DEST when both are in root;
    one test a line after the first, continued with backslashes (a shell takes it pasted)."""
    python, here = pytest_python(root).absolute(), dest.absolute()
    base = root.absolute()
    if python.is_relative_to(base) and here.is_relative_to(base):
        shown = os.path.relpath(python, here)
    else:
        shown = str(python)
    return f"cd {_shown(dest)} && {shown} -m pytest -q " + " \\\n      ".join(ex.tests)


def default_dir(root: Path, ex: Exercise) -> Path:
    return root / "build" / f"ch{ex.chapter:02d}-{ex.name}"


# --------------------------------------------------------------------------- command line


def add_command(sub) -> None:
    e = sub.add_parser("exercise", help="build a chapter with one of its functions taken out, to write")
    e.add_argument("chapter")
    e.add_argument("name", nargs="?", help="which exercise (default: list them)")
    e.add_argument("--list", action="store_true", help="list the chapter's exercises")
    e.add_argument("--solution", action="store_true", help="put the chapter's own code back")
    e.add_argument("--dir", type=Path, help="where to build (default: build/chNN-NAME)")
    e.add_argument("--force", action="store_true",
                   help="overwrite files of the tree that differ from what steps.py wrote there")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def command(root: Path, args) -> int:
    """The `exercise` command of steps.py."""
    try:
        if args.list or not args.name:
            ch = find_chapter(root, args.chapter)
            known = exercises(root, ch.n)
            if not known:
                print(f"第 {ch.n} 章没有机器检查的练习")
                return 0
            rows = [["练习", "要写的", "文件", "任务"]]
            rows += [[ex.name, ex.function, ex.file, ex.task] for ex in known]
            print(f"第 {ch.n} 章（{ch.title}）的练习，做其中一个：python tools/steps.py exercise {ch.n} 练习名\n")
            print(format_table(rows))
            return 0
        ex = find_exercise(root, args.chapter, args.name)
        dest = args.dir or default_dir(root, ex)
        test = pytest_command(root, ex, dest)
        again = f"python tools/steps.py exercise {ex.chapter} {ex.name}" + (
            f" --dir {_shown(dest)}" if args.dir else "")
        work = [] if args.force else readers_work(root, ex, dest, args.solution)
        if work:
            listed = "\n".join(f"  {_shown(dest / rel)}" for rel in work[:10])
            more = f"\n  ……共 {len(work)} 个" if len(work) > 10 else ""
            what = (f"放回参考实现会覆盖 {ex.file}" if args.solution
                    else "重新搭这棵树会覆盖或删掉它们")
            print(f"steps.py exercise: 没有改动 {_shown(dest)}：这些文件和 steps.py 写进去的不一样，"
                  f"应是你写的：\n{listed}{more}\n{what}。先把要留的复制出来，再加 --force：\n"
                  f"  {again}{' --solution' if args.solution else ''} --force", file=sys.stderr)
            return 1
        if args.solution:
            restore(root, ex, dest)
            print(f"已放回第 {ex.chapter} 章自己的 {ex.file}（{ex.function} 的参考实现）。测试应当通过：\n  {test}")
            return 0
        removed = prepare(root, ex, dest)
        names = "\n".join(f"  {node.partition('::')[2]}" for node in ex.tests)
        print(f"第 {ex.chapter} 章搭好了：{_shown(dest)}\n"
              f"取出了 {ex.file} 里 {ex.function} 的函数体（{removed} 行），换成了 raise NotImplementedError。\n"
              f"任务：{ex.task}\n"
              f"写好以后，让这 {len(ex.tests)} 个测试变绿：\n{names}\n"
              f"在树里运行它们：\n  {test}\n"
              f"参考答案：{again} --solution")
        return 0
    except StepsError as e:  # steps.py's own handler may hold a second copy of the class
        print(f"steps.py exercise: error: {e}", file=sys.stderr)
        return 2

