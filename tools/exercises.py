"""Machine-checked exercises: a chapter's tree with one of its own functions taken out.

Each chapter lists its exercises in its chapter.toml:

    [[exercises]]
    name = "evict"                                  # what the reader types
    file = "kvcache/radix_cache.py"                 # under minisgl/, a file the chapter writes
    function = "RadixCache.evict"                   # a function, or Class.method
    tests = ["tests/test_radix_cache.py::test_evict_frees_the_least_recently_used_leaf_first"]
    task = "按最久未用的顺序淘汰未锁住的叶子，……"   # one line, Chinese: what to write

`steps.py exercise N NAME` builds chapter N (as `build` does) and replaces that function's body
(its docstring stays) with `raise NotImplementedError("练习：<task>")`; the reader makes the
named tests pass. `--solution` copies the chapter's own file back. The selection is by the
syntax tree, so the library code carries no markers.

tests/test_exercises.py checks each exercise both ways. With the body taken out, the named
tests must fail (not error, not skip) and their output must show the exercise's
NotImplementedError. The solution is the chapter's file byte for byte, and `steps.py check N`
already runs the chapter's tests on that unmodified tree, so "the solution passes" needs no
second run.
"""

from __future__ import annotations

import ast
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import steps
from steps import PACKAGE, StepsError, find_chapter, format_table, overlay, tomllib

MARK = "练习："  # starts every taken-out body's error message


@dataclass(frozen=True)
class Exercise:
    chapter: int
    name: str
    file: str  # "minisgl/..." posix path
    function: str  # "name" or "Class.name"
    tests: tuple[str, ...]  # pytest node ids, relative to a built tree
    task: str

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
        found.append(Exercise(ch.n, entry["name"], f"{PACKAGE}/{entry['file']}", entry["function"],
                              tuple(entry["tests"]), entry["task"]))
    return found


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


def pytest_args(ex: Exercise) -> list[str]:
    return ["-m", "pytest", "-q", *ex.tests]


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
        test = f"cd {_shown(dest)} && python {' '.join(pytest_args(ex))}"
        if args.solution:
            restore(root, ex, dest)
            print(f"已放回第 {ex.chapter} 章自己的 {ex.file}（{ex.function} 的参考实现）。测试应当通过：\n  {test}")
            return 0
        removed = prepare(root, ex, dest)
        print(f"第 {ex.chapter} 章搭好了：{_shown(dest)}\n"
              f"取出了 {ex.file} 里 {ex.function} 的函数体（{removed} 行），换成了 raise NotImplementedError。\n"
              f"任务：{ex.task}\n"
              f"写好以后，让这个测试变绿：\n  {test}\n"
              f"参考答案：python tools/steps.py exercise {ex.chapter} {ex.name} --solution"
              + (f" --dir {_shown(dest)}" if args.dir else ""))
        return 0
    except StepsError as e:  # steps.py's own handler may hold a second copy of the class
        print(f"steps.py exercise: error: {e}", file=sys.stderr)
        return 2

