"""tools/steps.py on a small fixture repository: three chapters, trivial mains, no torch."""

import contextlib
import ctypes
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from processes import children_of, wait_all_gone

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

TOOL = Path(__file__).resolve().parents[1] / "tools" / "steps.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("steps_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


steps = _load_tool()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def chapter(root: Path, name: str, main: str, files: dict[str, str] = {}, toml: str = "") -> Path:
    d = root / "steps" / name
    write(d / "chapter.toml", f'title = "第 {name[2:4]} 章"\nstage = 0\n{toml}')
    write(d / "main.py", main)
    for rel, text in files.items():
        write(d / "minisgl" / rel, text)
    write(root / "book" / f"{name}.md", f"# {name}\n")
    return d


def make_repo(root: Path) -> Path:
    chapter(root, "ch00_a", 'print("第 0 步")\n', toml="early = []\nmax_main_lines = 5\n")
    chapter(root, "ch01_b", "import minisgl.x as x\nassert x.VALUE == 1\nprint('x =', x.VALUE)\n",
            {"__init__.py": "", "x.py": "# x\nVALUE = 1\nNAME = 'x'\n"})
    chapter(root, "ch02_c", "import minisgl.x, minisgl.y\nassert minisgl.x.VALUE == 2\nprint(minisgl.y.hello())\n",
            {"x.py": "# x\nVALUE = 2\nNAME = 'x'\n", "y.py": "def hello():\n    return 'y'\n"},
            toml='early = ["minisgl/y.py"]\n')
    (root / "python").mkdir()
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def set_main(root: Path, name: str, text: str) -> None:
    write(root / "steps" / name / "main.py", text)


def outcome(root: Path, spec: str):
    return steps.check_chapter(root, steps.find_chapter(root, spec))


def test_clean_fixture_passes_with_right_counts(repo: Path, capsys) -> None:
    steps.link(repo)
    assert steps.check(repo) == 0
    table = capsys.readouterr().out
    assert "ch02_c" in table and "失败" not in table
    o = outcome(repo, "2")
    assert (o.new, o.modified, o.early, o.passed, o.stdout) == (1, 1, 1, True, "y\n")
    o = outcome(repo, "ch01_b")
    assert (o.new, o.modified, o.early, o.stdout) == (2, 0, 0, "x = 1\n")


def test_chapter_numbers_accept_several_spellings(repo: Path) -> None:
    assert {steps.find_chapter(repo, s).name for s in ["1", "01", "ch01_b", "steps/ch01_b/", 1]} == {"ch01_b"}
    with pytest.raises(steps.StepsError, match="'7'"):
        steps.find_chapter(repo, "7")


def test_importing_a_later_chapters_module_is_caught(repo: Path) -> None:
    steps.link(repo)  # python/minisgl/y.py exists: main reaches it through the package path
    set_main(repo, "ch01_b", f"import minisgl\nminisgl.__path__.append({str(repo / 'python/minisgl')!r})\n"
             "import minisgl.y\n")
    o = outcome(repo, "1")
    assert not o.passed and "越界导入 minisgl.y（来自 " in o.error and "python/minisgl/y.py）" in o.error
    assert "main：退出码 1" in o.error  # refused at import time, not just noticed afterwards
    assert any("ImportError: step isolation: 'minisgl.y'" in line for line in o.output)


def test_an_editable_install_finder_is_caught(repo: Path) -> None:
    steps.link(repo)  # what setuptools' editable finder does: map the package to python/minisgl
    set_main(repo, "ch01_b", "import sys\nfrom importlib.machinery import PathFinder\n"
             "class Editable:\n    @staticmethod\n    def find_spec(name, path=None, target=None):\n"
             f"        return PathFinder.find_spec(name, [{str(repo / 'python/minisgl')!r}]) if name == 'minisgl.y' else None\n"
             "sys.meta_path.append(Editable)\nimport minisgl.y\n")
    o = outcome(repo, "1")
    assert "越界导入 minisgl.y" in o.error and "main：退出码 1" in o.error


def test_a_swallowed_import_error_still_fails(repo: Path) -> None:
    steps.link(repo)
    set_main(repo, "ch01_b", f"import sys\nsys.path.insert(0, {str(repo / 'python')!r})\n"
                             "try:\n    import minisgl.y\nexcept ImportError:\n    pass\n")
    o = outcome(repo, "1")
    assert not o.passed and "越界导入 minisgl（" in o.error and "main：退出码" not in o.error


def test_module_loaded_by_file_path_is_caught_at_exit(repo: Path) -> None:
    steps.link(repo)  # spec_from_file_location skips the finders; the exit sweep sees it
    set_main(repo, "ch01_b", "import importlib.util, sys\n"
             f"spec = importlib.util.spec_from_file_location('minisgl.y', {str(repo / 'python/minisgl/y.py')!r})\n"
             "sys.modules['minisgl.y'] = m = importlib.util.module_from_spec(spec)\n"
             "spec.loader.exec_module(m)\n")
    assert "越界导入 minisgl.y" in outcome(repo, "1").error


@pytest.mark.parametrize("propagate", [True, False])
def test_violation_in_a_child_process_is_caught(repo: Path, propagate: bool) -> None:
    steps.link(repo)
    child = f"import minisgl; minisgl.__path__.append({str(repo / 'python/minisgl')!r}); import minisgl.y"
    set_main(repo, "ch01_b", f"import subprocess, sys\nr = subprocess.run([sys.executable, '-c', {child!r}])\n"
             + ("sys.exit(r.returncode)\n" if propagate else ""))
    o = outcome(repo, "1")
    assert not o.passed and "越界导入 minisgl.y" in o.error and "在子进程中" in o.error
    assert ("main：退出码 1" in o.error) == propagate
    assert any("ImportError" in line for line in o.output)


# forkserver: how the engine starts its children (utils/process.py). The forkserver is a fresh
# interpreter, so sitecustomize installs the guard there, and its forks inherit it.
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_violation_in_a_multiprocessing_child_is_caught(repo: Path, method: str) -> None:
    steps.link(repo)
    set_main(repo, "ch01_b", "import multiprocessing as mp, sys\n"
             f"def peek():\n    import minisgl\n    minisgl.__path__.append({str(repo / 'python/minisgl')!r})\n"
             "    import minisgl.y\n"
             f"if __name__ == '__main__':\n    p = mp.get_context({method!r}).Process(target=peek)\n"
             "    p.start()\n    p.join()\n    print('child exit code', p.exitcode)\n")
    o = outcome(repo, "1")
    assert "child exit code 1" in o.stdout and "越界导入 minisgl.y" in o.error


def test_a_stale_link_tree_is_caught(repo: Path, capsys) -> None:
    steps.link(repo)
    pkg = repo / "python" / "minisgl"
    (pkg / "x.py").unlink()
    (pkg / "x.py").symlink_to("../../steps/ch01_b/minisgl/x.py")  # an older snapshot
    (pkg / "y.py").unlink()  # missing
    (pkg / "z.py").symlink_to("../../steps/ch02_c/minisgl/y.py")  # extra
    (pkg / "__init__.py").unlink()
    write(pkg / "__init__.py", "")  # a copy, not a link
    problems = "\n".join(steps.link_problems(repo))
    assert "x.py: points to ../../steps/ch01_b/minisgl/x.py, newest is steps/ch02_c/minisgl/x.py" in problems
    assert "y.py: missing" in problems and "z.py: extra" in problems and "__init__.py: a regular file" in problems
    assert steps.check(repo, ["0"]) == 1  # checked once, even when the chapters pass
    assert "python tools/steps.py link" in capsys.readouterr().out


def test_link_is_idempotent_and_relative(repo: Path) -> None:
    assert steps.link_problems(repo)  # nothing linked yet
    assert len(steps.link(repo)) == 3
    assert steps.link(repo) == [] and steps.link_problems(repo) == []
    pkg = repo / "python" / "minisgl"
    for rel, src in steps.final_overlay(repo).items():
        link = repo / "python" / rel
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == src.resolve()
    assert (pkg / "x.py").resolve() == (repo / "steps/ch02_c/minisgl/x.py").resolve()
    # A snapshot that goes away takes its link and its now-empty directory with it.
    write(repo / "steps/ch02_c/minisgl/sub/z.py", "")
    steps.link(repo)
    (repo / "steps/ch02_c/minisgl/sub/z.py").unlink()
    assert steps.link(repo) == ["- python/minisgl/sub/z.py", "- python/minisgl/sub/"]
    assert not (pkg / "sub").exists() and steps.link_problems(repo) == []


def test_link_refuses_to_overwrite_edited_regular_files(repo: Path) -> None:
    write(repo / "python/minisgl/x.py", "edited\n")
    with pytest.raises(steps.StepsError, match="python/minisgl/x.py"):
        steps.link(repo)


def test_tree_marks_new_modified_and_early(repo: Path) -> None:
    assert steps.render_tree(repo, 1) == (
        "minisgl/\n"
        "├── __init__.py       ← 新建\n"
        "└── x.py              ← 新建\n"
        "steps/ch01_b/main.py\n")
    assert steps.render_tree(repo, 2) == (
        "minisgl/\n"
        "├── __init__.py\n"
        "├── x.py              ← 修改\n"
        "└── y.py              ← 提前引入\n"
        "steps/ch02_c/main.py\n")


def test_tree_of_a_chapter_without_package_names_its_main(repo: Path) -> None:
    tree = steps.render_tree(repo, 0)
    assert tree.startswith("steps/ch00_a/main.py\n") and "还没有 minisgl 包" in tree


def test_tree_draws_directories_first(repo: Path) -> None:
    write(repo / "steps/ch02_c/minisgl/core/req.py", "")
    assert steps.render_tree(repo, 2).splitlines()[:4] == [
        "minisgl/", "├── core/", "│   └── req.py        ← 新建", "├── __init__.py"]


def test_diff_shows_the_replaced_lines(repo: Path) -> None:
    diff = steps.render_diff(repo, 2)
    assert "--- a/minisgl/x.py\n+++ b/minisgl/x.py\n" in diff
    assert "-VALUE = 1\n+VALUE = 2\n" in diff and "-NAME" not in diff
    assert "--- /dev/null\n+++ b/minisgl/y.py\n" in diff and "+def hello():\n" in diff
    assert steps.render_diff(repo, 0) == ""


def test_max_main_lines_is_enforced(repo: Path) -> None:
    set_main(repo, "ch00_a", "print(0)\n" * 6)
    o = outcome(repo, "0")
    assert not o.passed and "main.py 有 6 行，超过 max_main_lines = 5" in o.error


def test_a_missing_book_page_fails(repo: Path, capsys) -> None:
    steps.link(repo)
    (repo / "book" / "ch01_b.md").unlink()
    assert steps.check(repo, ["1"]) == 1
    out = capsys.readouterr().out
    assert "失败：缺少书页 book/ch01_b.md" in out and "失败时的全部输出" not in out  # main passed


def test_a_chapter_without_chapter_toml_fails_alone(repo: Path) -> None:
    (repo / "steps/ch01_b/chapter.toml").unlink()
    assert "缺少 steps/ch01_b/chapter.toml" in outcome(repo, "1").error
    assert outcome(repo, "2").passed


def test_a_failing_main_shows_its_output_tail(repo: Path, capsys) -> None:
    steps.link(repo)
    set_main(repo, "ch01_b", "print('before')\nraise SystemExit(3)\n")
    assert steps.check(repo, ["1"]) == 1
    out = capsys.readouterr().out
    assert "before" in out and "main：退出码 3" in out


def test_a_failing_main_shows_all_its_output(repo: Path, capsys) -> None:
    steps.link(repo)
    set_main(repo, "ch01_b", "for i in range(100):\n    print('line', i)\nraise SystemExit(3)\n")
    assert steps.check(repo, ["1"]) == 1
    out = capsys.readouterr().out
    assert "ch01_b：失败时的全部输出" in out and "line 0\n" in out and "line 99\n" in out


def test_chapters_checked_at_once_report_in_chapter_order(repo: Path, capsys) -> None:
    steps.link(repo)
    set_main(repo, "ch00_a", "import time\ntime.sleep(2)\nprint(0)\n")  # likely finishes last
    set_main(repo, "ch02_c", "raise SystemExit(4)\n")
    assert steps.check(repo, jobs=3) == 1
    captured = capsys.readouterr()
    rows = [line.split()[0] for line in captured.out.splitlines() if line.startswith("ch0")]
    assert rows == ["ch00_a", "ch01_b", "ch02_c"]
    assert "ch02_c：失败时的全部输出" in captured.out and "main：退出码 4" in captured.out
    assert "ch01_b：失败时的全部输出" not in captured.out
    progress = [line for line in captured.err.splitlines() if line.startswith("[")]
    # One line as each chapter finishes, in the order they finish, naming it and its result.
    finished = [re.fullmatch(r"\[(\d)/3\] (\S+) (通过|失败)（\d+ 秒）", line).groups() for line in progress]
    assert [n for n, _, _ in finished] == ["1", "2", "3"]
    assert sorted(r for _, *r in finished) == [["ch00_a", "通过"], ["ch01_b", "通过"], ["ch02_c", "失败"]]


# Run a script as from a terminal, where Ctrl-C raises KeyboardInterrupt. A process started in
# the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored, and
# the checker rightly leaves an ignored Ctrl-C alone: these tests must not depend on that.
AT_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.parametrize("target", ["process", "a-worker-thread"])
def test_ctrl_c_stops_every_chapter_at_once(repo: Path, target: str) -> None:
    steps.link(repo)
    for name in ("ch00_a", "ch01_b", "ch02_c"):
        set_main(repo, name, "import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    checker = subprocess.Popen([sys.executable, "-c", AT_A_TERMINAL, str(TOOL), "--root", str(repo),
                                "check", "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    mains: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(mains := children_of(checker.pid)) < 2:  # two chapters running
            assert time.monotonic() < deadline and checker.poll() is None
            time.sleep(0.1)
        if target == "process":
            checker.send_signal(signal.SIGINT)
        else:  # where the kernel may deliver it: a thread that waits for a chapter's program
            thread = max(int(t.name) for t in Path(f"/proc/{checker.pid}/task").iterdir())
            assert ctypes.CDLL(None, use_errno=True).tgkill(checker.pid, thread, signal.SIGINT) == 0
        assert checker.wait(20) != 0
        assert not wait_all_gone(mains, timeout=5.0), "a chapter's main is still running"
    finally:
        checker.kill()
        checker.wait()
        for main in mains:  # each in its own session: a failed check leaves none behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(main, signal.SIGKILL)


def test_a_program_still_starting_when_ctrl_c_stops_all_is_stopped_too(monkeypatch,
                                                                       tmp_path: Path) -> None:
    """The race behind a Ctrl-C that once left `check` waiting (the test above, on a busy
    machine): a chapter's program is already a child, so the test sends SIGINT, but its thread
    is still inside Popen and has not registered it for the kill."""
    started = threading.Event()

    class SlowToReturn(subprocess.Popen):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.set()
            time.sleep(1.0)  # the child runs; Popen has not returned to _run yet

    monkeypatch.setattr(subprocess, "Popen", SlowToReturn)
    steps._STOPPED.clear()
    result: list = []
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    runner = threading.Thread(target=lambda: result.append(
        steps._run(sleeper, tmp_path, dict(os.environ), False, None)))
    runner.start()
    try:
        assert started.wait(30)
        steps._stop_all()
        runner.join(15)
        assert not runner.is_alive(), "the program escaped the stop"
        assert result[0][0] == -signal.SIGKILL
        # After the stop nothing starts any more: it counts as killed (not as timed out).
        assert steps._run(sleeper, tmp_path, dict(os.environ), False, None) == (-signal.SIGKILL, "", [])
    finally:
        steps._STOPPED.clear()


def test_chapters_checked_side_by_side_let_waiting_threads_sleep(monkeypatch,
                                                                 tmp_path: Path) -> None:
    """Only the chapters' programs get the policy, and only when they share the CPUs; the
    checker's own environment is left as it was, and a policy the user chose wins."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = lambda shared: steps._guarded_env(tmp_path, tmp_path, tmp_path / "log", shared)  # noqa: E731
    assert env(True)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in env(False) and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert env(True)["OMP_WAIT_POLICY"] == "ACTIVE"


def test_record_saves_stdout_after_a_machine_header(repo: Path) -> None:
    steps.link(repo)
    set_main(repo, "ch01_b", "import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    assert steps.main(["--root", str(repo), "check", "01", "--record"]) == 0
    header, blank, *rest = (repo / "book/runs/ch01_b.txt").read_text(encoding="utf-8").split("\n")
    assert header.startswith("# 运行于 ") and "个逻辑核 · Python " in header and " · torch " in header
    assert blank == "" and rest == ["out", ""]


# A chapter test that reads minisgl.x.VALUE in the test process, in a subprocess and in a
# multiprocessing spawn child. VALUE is 1 in chapter 1 and 2 from chapter 2 on, so the module
# passes only where it really runs on chapter 1's tree.
VALUE_TEST = """import multiprocessing as mp
import subprocess
import sys

import minisgl.x

CHAPTER = {chapter}


def value():
    import minisgl.x
    return minisgl.x.VALUE


def test_value_here():
    assert minisgl.x.VALUE == 1


def test_value_in_a_subprocess():
    out = subprocess.run([sys.executable, "-c", "import minisgl.x; print(minisgl.x.VALUE)"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "1\\n"


def test_value_in_a_spawn_child():
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(value) == 1
"""


def add_test(root: Path, name: str, text: str) -> None:
    write(root / "tests" / name, text)


def test_a_chapters_own_tests_run_on_its_own_tree(repo: Path) -> None:
    steps.link(repo)  # python/minisgl has VALUE = 2: a test run against it would fail
    add_test(repo, "test_value.py", VALUE_TEST.format(chapter=1))
    o = outcome(repo, "1")
    assert o.passed, o.error
    assert o.tests == "3 passed"
    assert outcome(repo, "2").tests == ""  # chapter 2 declares no test module


def test_the_same_tests_fail_on_a_tree_where_they_do_not_hold(repo: Path) -> None:
    steps.link(repo)
    add_test(repo, "test_value.py", VALUE_TEST.format(chapter=2))
    o = outcome(repo, "2")
    assert not o.passed and o.tests == "3 failed" and "测试：退出码 1" in o.error
    assert any("assert 2 == 1" in line for line in o.output)


def test_a_chapter_test_reaching_outside_its_tree_fails(repo: Path) -> None:
    steps.link(repo)
    add_test(repo, "test_peek.py", f"import sys\nsys.path.insert(0, {str(repo / 'python')!r})\n"
             "CHAPTER = 1\n\ndef test_y():\n    import minisgl.y\n")
    o = outcome(repo, "1")
    assert not o.passed and "测试：越界导入 minisgl（来自 " in o.error and "python/minisgl" in o.error


def test_tests_run_only_after_main_passes(repo: Path) -> None:
    add_test(repo, "test_value.py", VALUE_TEST.format(chapter=1))
    set_main(repo, "ch01_b", "raise SystemExit(4)\n")
    o = outcome(repo, "1")
    assert o.error == "main：退出码 4" and o.tests == ""


def test_declared_chapter_reads_the_constant_without_importing(tmp_path: Path) -> None:
    cases = {"CHAPTER = 3\n": 3, "CHAPTER = None\n": None, "X = 1\n": "missing",
             "import nowhere_at_all\nCHAPTER = 5\n": 5}
    for i, (text, want) in enumerate(cases.items()):
        write(tmp_path / f"test_{i}.py", text)
        assert steps.declared_chapter(tmp_path / f"test_{i}.py") == want
    write(tmp_path / "test_bad.py", "CHAPTER = '3'\n")
    with pytest.raises(steps.StepsError, match="CHAPTER must be an int or None"):
        steps.declared_chapter(tmp_path / "test_bad.py")


def test_every_test_module_names_an_existing_chapter_or_none() -> None:
    root = Path(__file__).resolve().parents[1]
    numbers = {ch.n for ch in steps.chapters(root)}
    declared = {p.name: steps.declared_chapter(p) for p in sorted((root / "tests").glob("test_*.py"))}
    wrong = {name: n for name, n in declared.items() if n is not None and n not in numbers}
    assert wrong == {}, "test modules without a CHAPTER constant or naming no chapter"


def test_build_is_a_self_contained_chapter(repo: Path, tmp_path: Path, monkeypatch) -> None:
    add_test(repo, "test_value.py", VALUE_TEST.format(chapter=1))
    add_test(repo, "test_later.py", "CHAPTER = 2\n")
    write(repo / "tests" / "helpers.py", "HELP = 1\n")
    write(repo / "examples" / "ch01_b.py", "print('example')\n")
    (repo / "models").mkdir()
    monkeypatch.delenv("MINISGL_MODELS", raising=False)
    out = tmp_path / "out"
    steps.build(repo, 1, out)
    built = out / "minisgl"
    assert sorted(p.name for p in built.iterdir()) == ["__init__.py", "x.py"]
    assert not (built / "x.py").is_symlink() and "VALUE = 1" in (built / "x.py").read_text()
    assert (out / "main.py").read_text().startswith("import minisgl.x")
    assert sorted(p.name for p in (out / "tests").iterdir()) == ["helpers.py", "test_value.py"]
    assert (out / "examples" / "ch01_b.py").is_file() and (out / "pytest.ini").is_file()
    assert (out / "models").resolve() == (repo / "models").resolve()
    steps.build(repo, 2, out)  # rebuilding in place replaces the tree, tests and example
    assert "VALUE = 2" in (built / "x.py").read_text() and (built / "y.py").is_file()
    assert sorted(p.name for p in (out / "tests").iterdir()) == ["helpers.py", "test_later.py"]
    assert not (out / "examples").exists()


def test_build_links_models_from_the_environment(repo: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("MINISGL_MODELS", str(tmp_path / "elsewhere"))
    steps.build(repo, 1, tmp_path / "out")
    assert (tmp_path / "out" / "models").resolve() == (tmp_path / "elsewhere").resolve()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def test_partial_listings_in_the_book_cover_whole_blocks():
    """A listing included by line range (`--8<-- "file:a:b"`) goes stale silently when the file
    changes: it must start at a non-blank line numbered as the listing says, no line in it may
    be less indented than the first, and it must end where that block ends (the next line is
    blank or less indented)."""
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r'(?:linenums="(\d+)"[^\n]*\n\s*)?--8<-- "([^":]+):(\d+):(\d+)"')
    checked = 0
    for page in sorted((root / "book").glob("ch*.md")):
        for m in pattern.finditer(page.read_text()):
            numbered, path, start, end = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
            lines = (root / path).read_text().splitlines()
            where = f"{page.name}: {path}:{start}:{end}"
            assert numbered is None or int(numbered) == start, f"{where} numbered {numbered}"
            assert 1 <= start <= end <= len(lines), f"{where}: the file has {len(lines)} lines"
            first = lines[start - 1]
            assert first.strip(), f"{where} starts at a blank line"
            shallower = [n for n in range(start, end + 1)
                         if lines[n - 1].strip() and _indent(lines[n - 1]) < _indent(first)]
            assert not shallower, f"{where} starts inside a block that ends at line {shallower[0]}"
            after = lines[end] if end < len(lines) else ""
            assert not after.strip() or _indent(after) <= _indent(first), \
                f"{where} ends inside a block: next line is {after.strip()!r}"
            checked += 1
    assert checked > 0
