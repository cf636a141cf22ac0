#!/usr/bin/env python3
"""Mutation testing of the bookkeeping modules (the scheduler's, the tokenizer's stop and
detokenize state, the radix cache, the decode graphs, the attention backends' host-side
preparation, the sampler): plant one plausible bug at a time, run the module's tests, and
report the bugs no test noticed.

    python tools/mutate.py                      # every target, its unit tests
    python tools/mutate.py tokenizer/stop.py    # one target
    python tools/mutate.py --slow               # survivors also meet the scheduler tests
    python tools/mutate.py --list               # print the mutants, run nothing
    make mutate MUTATE="tokenizer/stop.py --report /tmp/mutants.md"

Mutants are generated mechanically from the module's syntax tree, one change each:
comparison flips (< <=, == !=, in / not in, is / is not), arithmetic and bitwise operator
flips, and/or swapped, one operand of and/or dropped, a `not` or unary minus dropped, an if /
while / comprehension condition forced True or False, an integer constant or a slice bound or a
range() argument moved by one, True/False swapped, min/max swapped, and a statement replaced by
`pass`. Docstrings, annotations, imports and message strings are left alone, and so is what
ONLY and EXCLUDE keep out (the attention itself, code that runs on a GPU only).

Each mutant runs in a scratch copy of the final package (python/minisgl with its links resolved
to real files, and copies of tests/ and examples/), with pytest -x and a time limit; a mutant
whose tests fail, crash or time out is killed. A survivor listed in tools/mutate_equivalent.txt
(its diff and a one-line reason) is reported as equivalent and left out of the score. Not part
of CI: on two shared CPU cores, scheduler/prefill.py (131 mutants) takes about 7 minutes and
scheduler/cache.py (147) about 14 (a killed mutant 2 to 5 s, a survivor about 15 s); all five
targets took about 100 minutes when last run together. The stage-4 targets, run two at a time
beside other jobs on the same two cores: engine/sampler.py (109 mutants) 21 minutes,
engine/graph.py (116) 55, attention/torch_backend.py's host side (64) 33,
attention/flashinfer_backend.py's (70) 38. The --slow pass adds minutes per survivor.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "minisgl"
EQUIVALENT = Path(__file__).resolve().parent / "mutate_equivalent.txt"

# Each target's unit tests: fast, run for every mutant. An entry is a test module, or a module
# and a pytest -k expression that selects its tests. Cheapest first: pytest -x stops a mutant at
# its first failing test, so the order decides how long a killed mutant takes.
FAST_SCHEDULER = "not random and not example"  # no randomized runs, no example processes
FAST_GRAPH = "not example and not tp2 and not replay_gives"  # no transformers, one process
FAST_ATTENTION = "not example and not hf"  # no transformers
FAST_FLASHINFER = "backend_matches or fa_backend or alternate"  # the fake against torch
TARGETS = {
    "kvcache/radix_cache.py": ["test_radix_cache.py", "test_admission.py"],
    "scheduler/prefill.py": [("test_admission.py", FAST_SCHEDULER),
                             ("test_radix_scheduler.py", FAST_SCHEDULER),
                             ("test_chunked_prefill.py", FAST_SCHEDULER),
                             ("test_admission.py", f"not ({FAST_SCHEDULER})")],
    "scheduler/cache.py": [("test_gpu_attention.py", "allocate"),
                           ("test_admission.py", FAST_SCHEDULER),
                           ("test_radix_scheduler.py", FAST_SCHEDULER),
                           ("test_chunked_prefill.py", FAST_SCHEDULER),
                           ("test_admission.py", f"not ({FAST_SCHEDULER})")],
    "tokenizer/stop.py": ["test_tokenizer.py"],
    "tokenizer/detokenize.py": ["test_tokenizer.py"],
    "engine/sampler.py": ["test_sampler.py", ("test_gpu_attention.py", "sampler")],
    "engine/graph.py": [("test_cuda_graph.py", FAST_GRAPH)],
    "attention/torch_backend.py": [("test_attention.py", FAST_ATTENTION),
                                   ("test_cuda_graph.py", FAST_GRAPH),
                                   ("test_gpu_attention.py", "not example and not generation")],
    "attention/flashinfer_backend.py": [("test_gpu_attention.py", FAST_FLASHINFER),
                                        ("test_cuda_graph.py", "flashinfer")],
}
# Only these functions of a target are mutated: the rest of the module is the device side (the
# attention itself), which the tests against dense attention and transformers cover.
ONLY = {
    "attention/torch_backend.py": {"prepare_metadata", "init_graph", "capture_metadata",
                                   "prepare_replay"},
    "attention/flashinfer_backend.py": {"_shape", "prepare_replay"},
}
# Classes and functions left alone: code that runs on a GPU only (tests/*_cuda.py cover it
# there), and Protocols (declarations: their `...` bodies never run).
EXCLUDE = {
    "engine/graph.py": {"CudaGraph", "Graph", "GraphBackend"},
}
# With --slow, the survivors of these targets then meet the scheduler tests that drive them
# (a model on the CPU, minutes a mutant), most relevant first.
SLOW = {
    "kvcache/radix_cache.py": ["test_radix_scheduler.py", "test_chunked_prefill.py",
                               "test_overlap.py"],
    "scheduler/prefill.py": ["test_chunked_prefill.py", "test_radix_scheduler.py",
                             "test_overlap.py"],
    "scheduler/cache.py": ["test_radix_scheduler.py", "test_chunked_prefill.py",
                           "test_overlap.py"],
}

PYTEST_INI = "[pytest]\ntestpaths = tests\npythonpath = . tests\naddopts = -p no:cacheprovider\n"


# --------------------------------------------------------------------------- generating mutants


@dataclass
class Mutant:
    target: str  # path inside the package
    line: int  # first line changed
    what: str  # a short description of the change
    source: str  # the whole mutated module
    diff: str  # unified diff against the original

    def key(self) -> list[str]:
        """The key of the equivalents list: the diff's lines, context (one line each side,
        marked `|`: the same change can occur twice in a file) and -/+ lines, stripped."""
        return [_key_line(x) for x in self.diff.splitlines()[2:] if not x.startswith("@@")]

    def entry_lines(self) -> list[str]:
        """The diff's lines as the equivalents list writes them."""
        return [("|" + x[1:]) if x.startswith(" ") else x
                for x in self.diff.splitlines()[2:] if not x.startswith("@@")]


def _key_line(line: str) -> str:
    kind = "|" if line[:1] in (" ", "|", "") else line[0]
    return kind + line[1:].strip()


COMPARE_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                 ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
                 ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BINOP_FLIPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
               ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift,
               ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
SYMBOLS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+",
           ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%",
           ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|"}
BODIES = ("body", "orelse", "finalbody")


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, decorators, imports, strings."""
    skip: set[int] = set()

    def drop(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                drop(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop(node.returns)
            for d in node.decorator_list:
                drop(d)
        elif isinstance(node, ast.ClassDef):
            for d in node.decorator_list:
                drop(d)
        elif isinstance(node, ast.arg):
            drop(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.JoinedStr)):
            drop(node)
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            drop(node)
    return skip


def _edits(tree: ast.Module, skip: set[int]) -> Iterator[tuple[ast.AST, ast.AST, str]]:
    """(original node, replacement node, description) for every single-point mutation."""
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}

    def swapped(node: ast.AST, **fields) -> ast.AST:
        new = copy.copy(node)
        for k, v in fields.items():
            setattr(new, k, v)
        return new

    def plus(expr: ast.expr, k: int) -> ast.expr:
        return ast.BinOp(expr, ast.Add() if k > 0 else ast.Sub(), ast.Constant(abs(k)))

    def number(v: int) -> ast.expr:  # -1 is written, and parsed, as -(1)
        return ast.Constant(v) if v >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-v))

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                new_op = COMPARE_FLIPS[type(op)]
                ops = node.ops[:i] + [new_op()] + node.ops[i + 1 :]
                yield node, swapped(node, ops=ops), \
                    f"`{SYMBOLS[type(op)]}` -> `{SYMBOLS[new_op]}`"
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOP_FLIPS:
            new_op = BINOP_FLIPS[type(node.op)]
            yield node, swapped(node, op=new_op()), \
                f"`{SYMBOLS[type(node.op)]}` -> `{SYMBOLS[new_op]}`"
        elif isinstance(node, ast.BoolOp):
            other = ast.Or if isinstance(node.op, ast.And) else ast.And
            yield node, swapped(node, op=other()), \
                f"`{type(node.op).__name__.lower()}` -> `{other.__name__.lower()}`"
            for i in range(len(node.values)):
                rest = node.values[:i] + node.values[i + 1 :]
                yield node, (rest[0] if len(rest) == 1 else swapped(node, values=rest)), \
                    f"operand {i + 1} of `{type(node.op).__name__.lower()}` dropped"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            yield node, node.operand, f"`{'not' if isinstance(node.op, ast.Not) else '-'}` dropped"
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield node, ast.Constant(not node.value), f"`{node.value}` -> `{not node.value}`"
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            for k in (1, -1):
                yield node, number(node.value + k), f"`{node.value}` -> `{node.value + k}`"
        elif isinstance(node, ast.Name) and node.id in ("min", "max") \
                and isinstance(parents.get(id(node)), ast.Call):
            other = "max" if node.id == "min" else "min"
            yield node, ast.Name(other, ast.Load()), f"`{node.id}` -> `{other}`"

        # Conditions forced one way (a `while` forced True would only time out).
        if isinstance(node, (ast.If, ast.IfExp)) or isinstance(node, ast.While):
            for value in ((False,) if isinstance(node, ast.While) else (True, False)):
                yield node.test, ast.Constant(value), f"condition -> `{value}`"
        elif isinstance(node, ast.comprehension):
            for cond in node.ifs:
                yield cond, ast.Constant(True), "comprehension filter -> `True`"
        # Off by one where a constant mutation does not reach: slice bounds, range() arguments.
        bounds: list[ast.expr] = []
        if isinstance(node, ast.Slice):
            bounds = [b for b in (node.lower, node.upper) if b is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "range":
            bounds = list(node.args[:2])
        for b in bounds:
            if id(b) in skip or isinstance(b, ast.Constant) or \
                    (isinstance(b, ast.UnaryOp) and isinstance(b.operand, ast.Constant)):
                continue
            for k in (1, -1):
                yield b, plus(b, k), f"bound `{ast.unparse(b)}` {'+' if k > 0 else '-'} 1"
        # A statement dropped (inside functions only: a class or module body is declarations).
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.For, ast.While,
                             ast.With, ast.Try)):
            for field in BODIES:
                for stmt in getattr(node, field, []):
                    if id(stmt) in skip or isinstance(stmt, (ast.Pass, ast.FunctionDef,
                                                             ast.ClassDef)):
                        continue
                    yield stmt, ast.Pass(), "statement removed"


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> ast.AST:
    """A copy of `tree` with the node `old` (by identity) replaced by `new`."""

    class Swap(ast.NodeTransformer):
        def visit(self, node):
            return new if node is old else self.generic_visit(node)

    return Swap().visit(copy.deepcopy(tree, {id(old): old}))


def _splice(source: str, node: ast.AST, text: str) -> str:
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode()))
    data = source.encode()
    start = offsets[node.lineno - 1] + node.col_offset
    end = offsets[node.end_lineno - 1] + node.end_col_offset
    return (data[:start] + text.encode() + data[end:]).decode()


def generate(target: str, source: str) -> tuple[list[Mutant], int]:
    """Every distinct mutant of `source`, and how many edits could not be written as text."""
    tree = ast.parse(source)
    skip = _skipped(tree)
    if target in ONLY:  # everything outside the named functions is left alone
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                  and f.name in ONLY[target] for n in ast.walk(f)}
        skip |= {id(n) for n in ast.walk(tree)} - inside
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) \
                and node.name in EXCLUDE.get(target, ()):
            skip.update(id(n) for n in ast.walk(node))
    seen, mutants, unwritable = {source}, [], 0
    for old, new, what in _edits(tree, skip):
        want = ast.dump(_replace(tree, old, new))
        text = ast.unparse(new)
        for candidate in (text, f"({text})"):
            mutated = _splice(source, old, candidate)
            try:
                if ast.dump(ast.parse(mutated)) == want:
                    break
            except SyntaxError:
                pass
        else:
            unwritable += 1
            continue
        if mutated in seen:
            continue
        seen.add(mutated)
        diff = "".join(difflib.unified_diff(source.splitlines(keepends=True),
                                            mutated.splitlines(keepends=True),
                                            f"a/{target}", f"b/{target}", n=1))
        mutants.append(Mutant(target, old.lineno, what, mutated, diff))
    mutants.sort(key=lambda m: m.line)
    return mutants, unwritable


# --------------------------------------------------------------------------- equivalent mutants


def read_equivalents(path: Path = EQUIVALENT) -> list[tuple[str, list[str], str]]:
    """Entries of (target, key, reason). The file holds blocks separated by blank lines:
    `target: reason`, then the mutant's diff lines: `|` context, `-` removed, `+` added."""
    if not path.exists():
        return []
    entries = []
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [x for x in block.splitlines() if x.strip() and not x.startswith("#")]
        if not lines:
            continue
        target, _, reason = lines[0].partition(":")
        key = [_key_line(x) for x in lines[1:] if x[:1] in ("|", "-", "+")]
        entries.append((target.strip(), key, reason.strip()))
    return entries


def equivalent_reason(mutant: Mutant, entries) -> str | None:
    key = mutant.key()
    for target, entry_key, reason in entries:
        if target == mutant.target and entry_key == key:
            return reason
    return None


# --------------------------------------------------------------------------- running


class Scratch:
    """A copy of the final package, the tests and the examples in a temporary directory."""

    def __init__(self, keep: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="minisgl-mutate-"))
        self.keep = keep
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(PACKAGE, self.dir / "minisgl", symlinks=False, ignore=ignore)
        for folder in ("tests", "examples"):  # tests run the examples from the tree's root
            shutil.copytree(ROOT / folder, self.dir / folder, symlinks=False, ignore=ignore)
        (self.dir / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
        (self.dir / "models").symlink_to(ROOT / "models", target_is_directory=True)
        self.env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                        MINISGL_MODELS=str(ROOT / "models"),
                        PYTHONPATH=os.pathsep.join([str(self.dir), str(self.dir / "tests")]))
        self.env.setdefault("OMP_NUM_THREADS", "1")  # a shared machine: one thread a process

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, target: str, source: str) -> None:
        (self.dir / "minisgl" / target).write_text(source, encoding="utf-8")

    def imports_from_here(self) -> bool:
        out = subprocess.run([sys.executable, "-c", "import minisgl; print(minisgl.__file__)"],
                             cwd=self.dir, env=self.env, capture_output=True, text=True)
        return Path(out.stdout.strip()).resolve().is_relative_to(self.dir.resolve())

    def select(self, entries: list[str | tuple[str, str]]) -> list[str]:
        """pytest arguments for a target's test entries: a module's path, or the ids of the
        tests its -k expression selects (one pytest run then takes each module's own -k)."""
        args = []
        for entry in entries:
            module, expression = (entry, None) if isinstance(entry, str) else entry
            if expression is None:
                args.append(f"tests/{module}")
                continue
            out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                                  "-k", expression, f"tests/{module}"],
                                 cwd=self.dir, env=self.env, capture_output=True, text=True)
            ids = [x for x in out.stdout.splitlines() if "::" in x]
            if out.returncode != 0 or not ids:
                raise RuntimeError(f"tests/{module} -k {expression!r} selects no test:\n"
                                   f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
            args += ids
        return args

    def pytest(self, tests: list[str], timeout: float) -> tuple[str, float, str]:
        """("passed" | "failed" | "timeout", seconds, output tail)."""
        start = time.monotonic()
        # A session of its own: on a timeout the whole group goes, children the tests started too.
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", *tests],
                                cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            status = "passed" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = "timeout"
        return status, time.monotonic() - start, out[-2000:]


@dataclass
class Outcome:
    mutant: Mutant
    result: str  # killed | survived | equivalent
    how: str  # what killed it: "failed in 3.1 s", "timeout", "scheduler tests"
    reason: str = ""


def run_target(target: str, scratch: Scratch, slow: bool, entries, log) -> list[Outcome] | None:
    original = (PACKAGE / target).read_text(encoding="utf-8")
    mutants, unwritable = generate(target, original)
    tests = scratch.select(TARGETS[target])
    status, base, out = scratch.pytest(tests, timeout=1800)
    names = [t if isinstance(t, str) else f"{t[0]} -k '{t[1]}'" for t in TARGETS[target]]
    log(f"{target}: {len(mutants)} mutants ({unwritable} edits not expressible as text); "
        f"baseline ({len(tests)} test ids or modules) {', '.join(names)}: {status} "
        f"in {base:.0f} s")
    if status != "passed":
        log(out)
        return None
    limit = 3 * base + 30
    outcomes = []
    try:
        for i, m in enumerate(mutants, 1):
            scratch.write(target, m.source)
            status, took, _ = scratch.pytest(tests, timeout=limit)
            if status == "passed":
                outcomes.append(Outcome(m, "survived", ""))
            else:
                outcomes.append(Outcome(m, "killed", f"{status} in {took:.0f} s"))
            log(f"  [{i}/{len(mutants)}] line {m.line}: {m.what}: "
                f"{outcomes[-1].result} ({took:.0f} s)")
        # Listed equivalents need no further tests; one that was killed is a stale entry.
        for o in outcomes:
            reason = equivalent_reason(o.mutant, entries)
            if reason and o.result == "survived":
                o.result, o.reason = "equivalent", reason
            elif reason:
                log(f"  line {o.mutant.line}: {o.mutant.what}: listed as equivalent but killed")
        survivors = [o for o in outcomes if o.result == "survived"]
        extra = [f"tests/{t}" for t in SLOW.get(target, [])
                 if (scratch.dir / "tests" / t).exists()]
        if slow and extra and survivors:
            scratch.write(target, original)
            status, base, out = scratch.pytest(extra, timeout=3600)
            log(f"{target}: {len(survivors)} survivors meet {' '.join(extra)}; baseline "
                f"{status} in {base:.0f} s")
            if status == "passed":
                for o in survivors:
                    scratch.write(target, o.mutant.source)
                    status, took, _ = scratch.pytest(extra, timeout=2 * base + 60)
                    if status != "passed":
                        o.result, o.how = "killed", f"scheduler tests only ({status}, {took:.0f} s)"
                    log(f"  line {o.mutant.line}: {o.mutant.what}: {o.result} ({took:.0f} s)")
            else:
                log(out)
    finally:
        scratch.write(target, original)
    return outcomes


def report(results: dict[str, list[Outcome]], minutes: dict[str, float], seconds: float) -> str:
    lines = ["# Mutation testing", "",
             f"{'file':<26}{'mutants':>8}{'killed':>8}{'equiv.':>8}{'survived':>9}{'score':>8}"
             f"{'min':>6}"]
    for target, outcomes in results.items():
        count = {r: sum(o.result == r for o in outcomes)
                 for r in ("killed", "equivalent", "survived")}
        scored = count["killed"] + count["survived"]
        score = f"{100 * count['killed'] / scored:.0f}%" if scored else "-"
        lines.append(f"{target:<26}{len(outcomes):>8}{count['killed']:>8}"
                     f"{count['equivalent']:>8}{count['survived']:>9}{score:>8}"
                     f"{minutes[target]:>6.0f}")
    lines.append(f"\n(score = killed / (killed + survived); took {seconds / 60:.0f} min)")
    for target, outcomes in results.items():
        slow = [o for o in outcomes if o.how.startswith("scheduler tests")]
        if slow:
            lines.append(f"\n## {target}: killed only by the scheduler tests\n")
            lines += [f"- line {o.mutant.line}: {o.mutant.what}" for o in slow]
        survivors = [o for o in outcomes if o.result == "survived"]
        if survivors:
            lines.append(f"\n## {target}: survivors\n")
            for o in survivors:
                lines += [f"line {o.mutant.line}: {o.mutant.what}", "```diff",
                          o.mutant.diff.rstrip("\n"), "```"]
        equivalent = [o for o in outcomes if o.result == "equivalent"]
        if equivalent:
            lines.append(f"\n## {target}: equivalent (tools/mutate_equivalent.txt)\n")
            lines += [f"- line {o.mutant.line}: {o.mutant.what}: {o.reason}" for o in equivalent]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", choices=[[], *TARGETS], metavar="TARGET",
                   help=f"modules to mutate (default: all of {', '.join(TARGETS)})")
    p.add_argument("--slow", action="store_true",
                   help="run the survivors of the scheduler modules against the scheduler tests "
                        "(hours on a small machine)")
    p.add_argument("--list", action="store_true", help="print the mutants and exit")
    p.add_argument("--report", type=Path, help="also write the report to this file")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = p.parse_args()
    targets = args.targets or list(TARGETS)
    if args.list:
        for target in targets:
            mutants, unwritable = generate(target, (PACKAGE / target).read_text("utf-8"))
            print(f"# {target}: {len(mutants)} mutants, {unwritable} not expressible as text")
            for m in mutants:
                print(f"{target}:{m.line}: {m.what}")
        return 0

    def log(message: str) -> None:
        print(message, flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the scratch copy is removed
    entries = read_equivalents()
    start = time.monotonic()
    scratch = Scratch(keep=args.keep)
    try:
        if not scratch.imports_from_here():
            log(f"the scratch copy {scratch.dir} is not what Python imports as minisgl")
            return 2
        results, minutes = {}, {}
        for target in targets:
            started = time.monotonic()
            outcomes = run_target(target, scratch, args.slow, entries, log)
            minutes[target] = (time.monotonic() - started) / 60
            if outcomes is None:
                log(f"{target}: its tests fail without a mutant; skipped")
                continue
            results[target] = outcomes
    finally:
        scratch.close()
    for target, key, reason in entries:
        if target in results and not any(o.mutant.key() == key for o in results[target]):
            log(f"{EQUIVALENT.name}: an entry for {target} matches no mutant (the code changed?)"
                f": {reason}")
    text = report(results, minutes, time.monotonic() - start)
    print("\n" + text)
    if args.report:
        args.report.write_text(text, encoding="utf-8")
    return 0 if len(results) == len(targets) else 1


if __name__ == "__main__":
    sys.exit(main())
