"""Every machine-checked exercise (tools/exercises.py), checked both ways.

Taken out: the exercise's tests run in the chapter's built tree and must fail -- each one a
failure, not a collection or fixture error, not a skip -- and the run's output must show the
message of the exercise's own NotImplementedError (so it failed because the body is missing,
not because of an import). Put back: the solution is the chapter's own file byte for byte
(checked here), and `tools/steps.py check N` runs the chapter's tests on exactly that tree, so
a second run here would prove nothing new. Each mistake an exercise lists (a plausible wrong
answer, patched into the chapter's function) fails at least one of the exercise's tests. The
command refuses to overwrite what the reader wrote, and prints a test command that a new shell
can run.
"""

import ast
import gc
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import exercises  # noqa: E402
import steps  # noqa: E402

FIRST, LAST = 1, 21  # the chapters that must each have at least one exercise
ALL = [ex for ch in steps.chapters(ROOT) for ex in exercises.exercises(ROOT, ch.n)]
IDS = [f"ch{ex.chapter:02d}-{ex.name}" for ex in ALL]
MISTAKES = [(ex, m) for ex in ALL for m in ex.mistakes]
MISTAKE_IDS = [f"ch{ex.chapter:02d}-{ex.name}-{m.name}" for ex, m in MISTAKES]
TIMEOUT = 300  # seconds for one exercise's tests (they stop at the missing body)


def test_every_chapter_has_an_exercise():
    have = {ex.chapter for ex in ALL}
    assert [n for n in range(FIRST, LAST + 1) if n not in have] == []


def test_names_are_unique_within_a_chapter():
    names = [(ex.chapter, ex.name) for ex in ALL]
    assert len(names) == len(set(names))


def _test_functions(module: Path) -> set[str]:
    tree = ast.parse(module.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.fixture(scope="module")
def chapter_tests() -> dict[int, dict[str, Path]]:
    """Each chapter's own test modules by file name, as steps.chapter_tests finds them."""
    modules: dict[int, dict[str, Path]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        modules.setdefault(steps.declared_chapter(path), {})[path.name] = path
    return modules


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_exercise_is_the_chapters_own_code_and_its_tests(ex, chapter_tests):
    ch = steps.find_chapter(ROOT, ex.chapter)
    assert ex.file in steps.snapshot_files(ch), f"{ex.file} is not a file chapter {ex.chapter} writes"
    source = (ch.dir / ex.file).read_text(encoding="utf-8")
    mine = ast.get_source_segment(source, exercises.function_node(source, ex.function))
    before = steps.overlay(ROOT, ex.chapter - 1).get(ex.file)
    if before is not None:  # the function must be new or changed in this chapter
        old = before.read_text(encoding="utf-8")
        try:
            earlier = ast.get_source_segment(old, exercises.function_node(old, ex.function))
        except steps.StepsError:
            earlier = None
        assert mine != earlier, f"{ex.function} is unchanged since chapter {ex.chapter - 1}"
    # Taken out, the function is its docstring (if any) and the raise; nothing else changed.
    taken, removed = exercises.take_out(source, ex)
    body = exercises.function_node(taken, ex.function).body
    assert removed > 0 and ast.unparse(body[-1]) == f"raise NotImplementedError({ex.message!r})"
    assert len(taken.splitlines()) == len(source.splitlines()) - removed + 1
    own = chapter_tests[ex.chapter]
    for node in ex.tests:
        module, _, function = node.partition("::")
        name = Path(module).name
        assert name in own, f"{module} is not one of chapter {ex.chapter}'s test modules"
        assert function.split("[")[0] in _test_functions(own[name]), f"no {node}"
    page = (ROOT / "book" / f"{ch.name}.md").read_text(encoding="utf-8")
    assert f"python tools/steps.py exercise {ex.chapter} {ex.name}" in page


def test_the_command_lists_takes_out_and_puts_back(tmp_path, capsys):
    ex = exercises.find_exercise(ROOT, 9, "evict")
    assert steps.main(["exercise", "9", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(e.name in listed for e in exercises.exercises(ROOT, 9))
    dest, chapter_file = tmp_path / "evict", exercises.chapter_file(ROOT, ex)
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"-m pytest -q {' '.join(ex.tests)}" in _joined(out)
    assert all(node.partition("::")[2] in out for node in ex.tests)
    assert f"raise NotImplementedError({ex.message!r})" in (dest / ex.file).read_text(encoding="utf-8")
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest)]) == 0  # untouched: again
    assert steps.main(["exercise", "9", "evict", "--solution", "--dir", str(dest)]) == 0
    assert (dest / ex.file).read_bytes() == chapter_file.read_bytes()
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest)]) == 0  # the solution: again
    assert steps.main(["exercise", "9", "no_such_exercise"]) == 2
    assert "evict" in capsys.readouterr().err  # the error lists the chapter's exercises


def _joined(out: str) -> str:
    """The command's output with the printed test command's continued lines joined."""
    return re.sub(r" \\\n\s*", " ", out)


def _write_an_answer(path: Path) -> str:
    mine = path.read_text(encoding="utf-8").replace(
        "raise NotImplementedError", "pass  # mine\n        raise NotImplementedError")
    path.write_text(mine, encoding="utf-8")
    return mine


@pytest.mark.parametrize("solution", [False, True], ids=["again", "solution"])
def test_the_command_keeps_the_readers_answer_unless_forced(tmp_path, capsys, solution):
    ex = exercises.find_exercise(ROOT, 9, "evict")
    dest = tmp_path / "evict"
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest)]) == 0
    mine = _write_an_answer(dest / ex.file)
    again = ["exercise", "9", "evict", "--dir", str(dest)] + (["--solution"] if solution else [])
    capsys.readouterr()
    assert steps.main(again) == 1
    err = capsys.readouterr().err
    assert ex.file in err and "--force" in err
    assert (dest / ex.file).read_text(encoding="utf-8") == mine  # kept
    assert steps.main(again + ["--force"]) == 0
    assert (dest / ex.file).read_text(encoding="utf-8") != mine


def test_a_rebuild_keeps_the_readers_other_files_unless_forced(tmp_path, capsys):
    dest = tmp_path / "evict"
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest)]) == 0
    (dest / "tests" / "test_mine.py").write_text("def test_mine(): pass\n", encoding="utf-8")
    capsys.readouterr()
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest)]) == 1
    assert "tests/test_mine.py" in capsys.readouterr().err
    assert (dest / "tests" / "test_mine.py").exists()
    assert steps.main(["exercise", "9", "evict", "--dir", str(dest), "--solution"]) == 0  # one file
    assert (dest / "tests" / "test_mine.py").exists()


def test_a_directory_that_is_no_tree_is_not_overwritten(tmp_path, capsys):
    dest = tmp_path / "project"
    (dest / "tests").mkdir(parents=True)
    (dest / "tests" / "test_x.py").write_text("x = 1\n", encoding="utf-8")
    for extra in ([], ["--solution"]):
        assert steps.main(["exercise", "9", "evict", "--dir", str(dest), *extra]) == 1
        assert (dest / "tests" / "test_x.py").read_text(encoding="utf-8") == "x = 1\n"


def test_the_printed_test_command_runs_from_a_new_shell(tmp_path):
    """The command's interpreter is one with the project installed, not whatever `python` a new
    shell finds: paste what is printed, continued lines and all, into a shell with a bare PATH
    (the NotImplementedError shows that pytest ran the named tests in the tree)."""
    dest = ROOT / "build" / "test-exercise-command"
    shutil.rmtree(dest, ignore_errors=True)
    try:
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "steps.py"), "exercise", "9",
                              "evict", "--dir", str(dest)], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout
        lines = out.splitlines()
        start = next(i for i, line in enumerate(lines) if " -m pytest " in line)
        end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
        command = "\n".join(lines[start : end + 1])
        assert command.strip().startswith("cd build/test-exercise-command && ../../")
        run = subprocess.run(["bash", "-c", command], cwd=ROOT, text=True, capture_output=True,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=TIMEOUT)
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
        assert f"{len(exercises.find_exercise(ROOT, 9, 'evict').tests) * 2} failed" in run.stdout
        assert "NotImplementedError: 练习" in run.stdout
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Each test case of a junit report -> (its outcome, all its text: traceback and output)."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        text = "".join(case.itertext()) + "".join(c.get("message", "") for c in case)
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        found[name] = ("+".join(kinds) or "passed", text)
    return found


def _pytest_in_tree(tree: str, args: list[str], log: str) -> None:
    """Run pytest inside a built tree. The process is a fork of a server that imported torch
    and transformers once (their import is most of a short test run's cost), so nothing of
    the repository may stay importable: only the tree is on the path, here and in children."""
    gc.freeze()  # what the fork inherited: pytest's gc.collect() at exit would walk it all
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(tree)
    os.environ["PYTHONPATH"] = tree
    repository = {str(ROOT), str(ROOT / "python"), str(ROOT / "tests"), str(ROOT / "tools")}
    sys.path[:] = [tree] + [p for p in sys.path if p and str(Path(p).absolute()) not in repository]
    for name in [m for m in sys.modules if m == "minisgl" or m.startswith("minisgl.")]:
        del sys.modules[name]
    code = pytest.main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


@pytest.fixture(scope="module")
def forkserver():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers", "pytest", "safetensors"])
    return context


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """built(n): chapter n's tree, built once (building parses every test module)."""
    trees: dict[int, Path] = {}

    def get(n: int) -> Path:
        if n not in trees:
            trees[n] = tmp_path_factory.mktemp(f"ch{n:02d}")
            steps.build(ROOT, n, trees[n])
        return trees[n]

    return get


def _run_tests(ex, tree: Path, tmp_path: Path, forkserver) -> tuple[int, dict, str]:
    """ex's tests in tree: pytest's exit code, each case's outcome, the end of the output."""
    junit, log = tmp_path / "junit.xml", tmp_path / "pytest.log"
    # Plain asserts and no anyio plugin: the check reads the exception, and both cost a second.
    args = [*ex.tests, "-q", "-p", "no:cacheprovider", "-p", "no:anyio", "--assert=plain",
            f"--junitxml={junit}", "-o", "junit_logging=all"]
    run = forkserver.Process(target=_pytest_in_tree, args=(str(tree), args, str(log)))
    run.start()
    run.join(TIMEOUT)
    if run.is_alive():
        run.kill()
        run.join()
    output = log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""
    return run.exitcode, _outcomes(junit) if junit.exists() else {}, output


def _tree_with(ex, text: str, tmp_path: Path, built) -> Path:
    """A copy of ex's chapter tree (what exercises.prepare builds) with ex's file set to text."""
    tree = tmp_path / "tree"
    shutil.copytree(built(ex.chapter), tree, symlinks=True)
    (tree / ex.file).write_text(text, encoding="utf-8")
    return tree


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_taken_out_its_tests_fail_on_the_exercise(ex, tmp_path, forkserver, built):
    taken, _ = exercises.take_out(exercises.chapter_file(ROOT, ex).read_text(encoding="utf-8"), ex)
    code, outcomes, output = _run_tests(ex, _tree_with(ex, taken, tmp_path, built), tmp_path,
                                        forkserver)
    assert code == 1, f"pytest exited {code} (1: tests failed)\n{output}"
    assert len(outcomes) >= len(ex.tests), (sorted(outcomes), output)  # parametrised tests: more
    for name, (kind, text) in outcomes.items():
        assert kind == "failure", f"{name}: {kind}, expected a failure\n{text[-3000:]}"
        # The exercise's message: as the exception, or quoted by pytest.raises(RuntimeError,
        # match=...), which catches a NotImplementedError and then reports its message.
        assert ex.message in text, f"{name} failed for another reason:\n{text[-3000:]}"


@pytest.mark.parametrize("ex, mistake", MISTAKES, ids=MISTAKE_IDS)
def test_a_listed_mistake_fails_the_exercises_tests(ex, mistake, tmp_path, forkserver, built):
    wrong = exercises.make_mistake(exercises.chapter_file(ROOT, ex).read_text(encoding="utf-8"),
                                   ex, mistake)
    code, outcomes, output = _run_tests(ex, _tree_with(ex, wrong, tmp_path, built), tmp_path,
                                        forkserver)
    assert code == 1, f"{mistake.what}: pytest exited {code} (1: tests failed)\n{output}"
    kinds = {kind for kind, _ in outcomes.values()}
    assert "failure" in kinds and kinds <= {"passed", "failure"}, (outcomes, output)
