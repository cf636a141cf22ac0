#!/usr/bin/env python3
"""The step checker: chapter snapshots under steps/ and the package they add up to.

steps/chNN_<slug>/minisgl/... holds every file chapter NN creates or replaces. The package at
chapter N is the overlay of chapters 0..N (later chapters win); python/minisgl is the overlay of
all chapters as relative symlinks. A built chapter (`build N DIR`) is self-contained: the package,
main.py, the test modules that name chapter N (`CHAPTER = N`), the chapter's example and a link to
models/; `check` builds every chapter that way and runs its main and its tests there.
Commands: check, tree, diff, build, link, exercise (tools/exercises.py; see --help).
The book's mkdocs hook imports this file and calls render_tree(root, n) / render_diff(root, n).
"""

import argparse
import ast
import compileall
import difflib
import importlib.metadata
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import date
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TOOLS = Path(__file__).resolve().parent
REPO_ROOT = TOOLS.parent
CHAPTER_DIR = re.compile(r"ch(\d{2})_\w+")
PACKAGE = "minisgl"


class StepsError(Exception):
    """A problem with the repository layout or the command line (not a failing chapter)."""


# --------------------------------------------------------------------------- chapters, overlays


@dataclass(frozen=True)
class Chapter:
    n: int
    dir: Path
    title: str
    early: tuple[str, ...]
    max_main_lines: int | None

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def main(self) -> Path:
        return self.dir / "main.py"


def load_chapter(d: Path, n: int) -> Chapter:
    # A missing chapter.toml fails that chapter in check (a chapter being written), not the run.
    toml = d / "chapter.toml"
    try:
        meta = tomllib.loads(toml.read_text(encoding="utf-8")) if toml.is_file() else {}
    except tomllib.TOMLDecodeError as e:
        raise StepsError(f"{toml}: {e}") from e
    return Chapter(n, d, meta.get("title", ""), tuple(meta.get("early", [])), meta.get("max_main_lines"))


def chapters(root: Path) -> list[Chapter]:
    """All chapters under root/steps, sorted by number."""
    found: dict[int, Chapter] = {}
    for d in sorted((root / "steps").glob("ch*")):
        m = CHAPTER_DIR.fullmatch(d.name)
        if not (m and d.is_dir()):
            continue
        n = int(m.group(1))
        if n in found:
            raise StepsError(f"two directories for chapter {n}: {found[n].name} and {d.name}")
        found[n] = load_chapter(d, n)
    return [found[n] for n in sorted(found)]


def find_chapter(root: Path, spec: "str | int") -> Chapter:
    """Accept 3, "3", "03", "ch03_models" or "steps/ch03_models/"."""
    name = Path(str(spec)).name
    for ch in chapters(root):
        if name == ch.name or (name.isdigit() and int(name) == ch.n):
            return ch
    raise StepsError(f"no chapter {spec!r} under {root / 'steps'}")


def _is_cache(p: Path) -> bool:
    return "__pycache__" in p.parts or p.suffix == ".pyc"


def snapshot_files(ch: Chapter) -> list[str]:
    """Package files this chapter creates or replaces, as 'minisgl/...' posix paths."""
    top = ch.dir / PACKAGE
    if not top.is_dir():
        return []
    return sorted(p.relative_to(ch.dir).as_posix() for p in top.rglob("*") if p.is_file() and not _is_cache(p))


def overlay(root: Path, n: int) -> dict[str, Path]:
    """The package at chapter n: 'minisgl/...' path -> newest snapshot of it up to chapter n."""
    files: dict[str, Path] = {}
    for ch in chapters(root):
        if ch.n <= n:
            files.update((rel, ch.dir / rel) for rel in snapshot_files(ch))
    return dict(sorted(files.items()))


def final_overlay(root: Path) -> dict[str, Path]:
    return overlay(root, sys.maxsize)


def touched(root: Path, ch: Chapter) -> dict[str, str]:
    """Each file chapter ch writes -> 'new' or 'modified' (relative to chapter n-1)."""
    before = overlay(root, ch.n - 1)
    return {rel: "modified" if rel in before else "new" for rel in snapshot_files(ch)}


def materialise(files: dict[str, Path], dest: Path) -> None:
    """Copy an overlay under dest (copies, so module __file__s point inside dest)."""
    for rel, src in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def declared_chapter(test_module: Path) -> "int | None | str":
    """The module-level `CHAPTER = ...` of a test module: an int, None (repository tooling), or
    the string "missing" when the module does not say. Read without importing the module."""
    tree = ast.parse(test_module.read_text(encoding="utf-8"), str(test_module))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["CHAPTER"]:
            value = ast.literal_eval(node.value)
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                return value
            raise StepsError(f"{test_module}: CHAPTER must be an int or None, not {value!r}")
    return "missing"


def chapter_tests(root: Path, n: int) -> list[Path]:
    """The test modules of chapter n: tests/test_*.py that declare `CHAPTER = n`."""
    return [p for p in sorted((root / "tests").glob("test_*.py")) if declared_chapter(p) == n]


def test_helpers(root: Path) -> list[Path]:
    """What every chapter's tests may import: tests/*.py that are not test modules (conftest...)."""
    return [p for p in sorted((root / "tests").glob("*.py")) if not p.name.startswith("test_")]


def chapter_example(root: Path, ch: Chapter) -> Path | None:
    path = root / "examples" / f"{ch.name}.py"
    return path if path.is_file() else None


# --------------------------------------------------------------------------- tree and diff


def _nest(paths: list[str]) -> dict:
    """'minisgl/a/b.py' paths -> nested dicts below minisgl/; leaves hold the path."""
    tree: dict = {}
    for rel in paths:
        *dirs, leaf = rel.split("/")[1:]
        node = tree
        for d in dirs:
            node = node.setdefault(d, {})
        node[leaf] = rel
    return tree


def _draw(node: dict, prefix: str = "") -> list[tuple[str, str | None]]:
    """Lines of a `tree --dirsfirst` drawing, each with the file path it shows (None for dirs)."""
    entries = sorted(node.items(), key=lambda kv: (not isinstance(kv[1], dict), kv[0]))
    lines: list[tuple[str, str | None]] = []
    for i, (name, child) in enumerate(entries):
        last = i == len(entries) - 1
        branch = "└── " if last else "├── "
        if isinstance(child, dict):
            lines.append((f"{prefix}{branch}{name}/", None))
            lines += _draw(child, prefix + ("    " if last else "│   "))
        else:
            lines.append((prefix + branch + name, child))
    return lines


def render_tree(root: Path, n: int) -> str:
    """The annotated file tree of chapter n's package, for the book page."""
    ch = find_chapter(root, n)
    marks = {rel: "新建" if kind == "new" else "修改" for rel, kind in touched(root, ch).items()}
    marks.update((rel, "提前引入") for rel in ch.early)
    files = list(overlay(root, n))
    lines = [(f"{PACKAGE}/", None)] + _draw(_nest(files)) if files else []
    lines.append((f"steps/{ch.name}/main.py", None))
    width = max(len(text) for text, _ in lines)
    out = [text.ljust(width) + (f"  ← {marks[rel]}" if rel in marks else "") for text, rel in lines]
    if not files:
        out.append(f"（第 {ch.n} 章还没有 {PACKAGE} 包：main.py 不导入任何 {PACKAGE} 模块）")
    return "\n".join(line.rstrip() for line in out) + "\n"


def _lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]


def render_diff(root: Path, n: int) -> str:
    """Unified diff of chapter n-1's package against chapter n's, file by file."""
    ch = find_chapter(root, n)
    before = overlay(root, ch.n - 1)
    parts: list[str] = []
    for rel in snapshot_files(ch):
        old = _lines(before[rel]) if rel in before else []
        old_name = f"a/{rel}" if rel in before else "/dev/null"
        parts += difflib.unified_diff(old, _lines(ch.dir / rel), old_name, f"b/{rel}")
    return "".join(parts)


PYTEST_INI = """[pytest]
testpaths = tests
pythonpath = . tests
timeout = 900
addopts = -p no:cacheprovider
"""


def models_dir(root: Path) -> Path:
    """Where the checkpoints live: $MINISGL_MODELS, else the repository's models/."""
    return Path(os.environ.get("MINISGL_MODELS") or root / "models").absolute()


def build(root: Path, n: int, dest: Path) -> None:
    """Materialise chapter n as a self-contained directory: dest/minisgl (the overlay),
    dest/main.py, dest/tests (the chapter's test modules and the shared helpers), the chapter's
    example under dest/examples, dest/pytest.ini, and dest/models linking to the checkpoints.
    Run from dest, `python main.py`, `python -m pytest` and the example use only this tree."""
    ch = find_chapter(root, n)
    for stale in (PACKAGE, "tests", "examples"):
        shutil.rmtree(dest / stale, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    materialise(overlay(root, ch.n), dest)
    shutil.copy2(ch.main, dest / "main.py")
    tests = chapter_tests(root, ch.n)
    if tests:
        (dest / "tests").mkdir()
        for path in test_helpers(root) + tests:
            shutil.copy2(path, dest / "tests" / path.name)
        (dest / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    example = chapter_example(root, ch)
    if example:
        (dest / "examples").mkdir()
        shutil.copy2(example, dest / "examples" / example.name)
    link = dest / "models"
    if link.is_symlink() or not link.exists():
        if link.is_symlink():
            link.unlink()
        link.symlink_to(models_dir(root), target_is_directory=True)


# --------------------------------------------------------------------------- python/minisgl links


def link_problems(root: Path) -> list[str]:
    """How python/minisgl differs from relative links to the newest snapshot of every file."""
    want, base = final_overlay(root), root / "python"
    pkg = base / PACKAGE
    if pkg.is_symlink():
        return [f"python/{PACKAGE} is a link; it must be a real directory"]
    problems = []
    for rel, src in want.items():
        dst = base / rel
        if not dst.is_symlink():
            problems.append(f"python/{rel}: {'a regular file, not a link' if dst.exists() else 'missing'}")
        elif os.path.isabs(os.readlink(dst)):
            problems.append(f"python/{rel}: absolute link {os.readlink(dst)}")
        elif os.path.realpath(dst) != os.path.realpath(src):
            problems.append(f"python/{rel}: points to {os.readlink(dst)}, newest is {src.relative_to(root)}")
    for dirpath, dirnames, filenames in os.walk(pkg):
        for d in [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            problems.append(f"python/{Path(dirpath, d).relative_to(base).as_posix()}: a directory link")
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not Path(dirpath, d).is_symlink()]
        for f in filenames:
            rel = Path(dirpath, f).relative_to(base).as_posix()
            if rel not in want and not f.endswith(".pyc"):
                problems.append(f"python/{rel}: extra, no chapter has it")
    return problems


def _real_dirs(base: Path, d: Path, changed: list[str]) -> None:
    """Make every directory below base down to d a real directory (replacing directory links)."""
    parts = d.relative_to(base).parts
    for p in (base.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)):
        if p.is_symlink():
            p.unlink()
            changed.append(f"- python/{p.relative_to(base).as_posix()} (directory link)")
        p.mkdir(exist_ok=True)


def _prune(base: Path, want: dict[str, Path], changed: list[str]) -> None:
    """Remove links no chapter accounts for, then directories left empty."""
    for dirpath, dirnames, filenames in os.walk(base / PACKAGE, topdown=False):
        here = Path(dirpath)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            path, rel = here / name, (here / name).relative_to(base).as_posix()
            if rel in want or _is_cache(path):
                continue
            if not path.is_symlink():
                raise StepsError(f"python/{rel} is a regular file no chapter has: move it into steps/")
            path.unlink()
            changed.append(f"- python/{rel}")
        if here != base / PACKAGE and not [e for e in os.listdir(here) if e != "__pycache__"]:
            shutil.rmtree(here)
            changed.append(f"- python/{here.relative_to(base).as_posix()}/")


def link(root: Path) -> list[str]:
    """Regenerate python/minisgl from steps/; returns what changed (empty when up to date)."""
    want, base, changed = final_overlay(root), (root / "python").absolute(), []
    (base / PACKAGE).mkdir(parents=True, exist_ok=True)
    for rel, src in want.items():
        dst = base / rel
        _real_dirs(base, dst.parent, changed)
        target = os.path.relpath(src.absolute(), dst.parent)
        if dst.is_symlink() and os.readlink(dst) == target:
            continue
        if dst.exists() and not dst.is_symlink() and (dst.is_dir() or dst.read_bytes() != src.read_bytes()):
            raise StepsError(f"python/{rel} is not a link and differs from {src.relative_to(root)}: "
                             "move your edits into that snapshot first")
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        dst.symlink_to(target)
        changed.append(f"+ python/{rel} -> {target}")
    _prune(base, want, changed)
    return changed


# --------------------------------------------------------------------------- running a chapter


# Python imports sitecustomize from PYTHONPATH at start-up, so children get the guard too. (It
# shadows a distribution's own sitecustomize; those only add crash reporters and the like.)
SITECUSTOMIZE = "import os\nif os.environ.get('MINISGL_STEP_TREE'):\n    import _minisgl_step_guard\n"


@dataclass
class Outcome:
    chapter: Chapter
    new: int
    modified: int
    early: int
    seconds: float = 0.0
    tests: str = ""  # pytest's summary of the chapter's own test modules ("" when it has none)
    error: str = ""  # empty: passed
    ran_failed: bool = False  # main or the tests failed (so their output is worth showing)
    stdout: str = ""  # main's stdout
    output: tuple[str, ...] = ()  # stdout and stderr lines of what failed (else of main), interleaved

    @property
    def passed(self) -> bool:
        return not self.error


def static_problems(root: Path, ch: Chapter) -> list[str]:
    """What fails the chapter without running it: book page, main's length, early entries."""
    problems = [] if (ch.dir / "chapter.toml").is_file() else [f"缺少 steps/{ch.name}/chapter.toml"]
    if not (root / "book" / f"{ch.name}.md").is_file():
        problems.append(f"缺少书页 book/{ch.name}.md")
    if not ch.main.is_file():
        problems.append(f"缺少 {ch.main.relative_to(root)}")
    elif ch.max_main_lines is not None:
        count = len(ch.main.read_text(encoding="utf-8").splitlines())
        if count > ch.max_main_lines:
            problems.append(f"main.py 有 {count} 行，超过 max_main_lines = {ch.max_main_lines}")
    own = set(snapshot_files(ch))
    problems += [f"early 里的 {rel} 不是本章的文件" for rel in ch.early if rel not in own]
    return problems


def _guarded_env(tree: Path, boot: Path, log: Path, shared_cpus: bool) -> dict[str, str]:
    env = dict(os.environ)
    if shared_cpus:
        # Chapters run side by side: OpenMP threads that wait must sleep, not spin on a core
        # another chapter's threads need (tests/conftest.py says what spinning costs).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    paths = [str(tree), str(boot)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(PYTHONPATH=os.pathsep.join(paths), MINISGL_STEP_TREE=str(tree), MINISGL_STEP_LOG=str(log),
               PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
    return env


# The chapters' programs running now, in the pool's threads: on Ctrl-C the main thread kills
# their sessions, so that their threads return at once.
_RUNNING: "set[subprocess.Popen]" = set()
# Held while a program starts and is registered, and while Ctrl-C stops them all: a program
# visible as a child but not registered yet (its thread still inside Popen) would escape the
# kill and keep the pool waiting. After a stop, nothing starts any more.
_STARTING = threading.Lock()
_STOPPED = threading.Event()


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop_all() -> None:
    with _STARTING:
        _STOPPED.set()
        for proc in list(_RUNNING):
            _kill_session(proc)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], verbose: bool,
         timeout: float | None) -> tuple[int | None, str, list[str]]:
    """Run cmd, collecting stdout and the interleaved output; rc None means it timed out."""
    with _STARTING:
        if _STOPPED.is_set():  # Ctrl-C stopped everything: this one counts as killed, not run
            return -signal.SIGKILL, "", []
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                errors="replace", start_new_session=True)
        _RUNNING.add(proc)
    stdout: list[str] = []
    combined: list[str] = []

    def pump(stream, sink: list[str], echo) -> None:
        for line in stream:
            sink.append(line)
            combined.append(line)  # list.append is atomic under the GIL
            if verbose:
                echo.write(line)
                echo.flush()

    threads = [threading.Thread(target=pump, args=(proc.stdout, stdout, sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, [], sys.stderr), daemon=True)]
    for t in threads:
        t.start()
    rc: int | None = None
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also on Ctrl-C: the chapter's processes live in their own session, so kill it
        if rc is None:
            _kill_session(proc)
        for t in threads:
            t.join(10)
        if any(t.is_alive() for t in threads):  # main exited, but its children hold the pipes
            _kill_session(proc)
            for t in threads:
                t.join(10)
        proc.wait()
        _RUNNING.discard(proc)
    return rc, "".join(stdout), combined


PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed).*?)(?: in [\d.]+s.*)?\s*=*$")


def _pytest_summary(lines: Sequence[str]) -> str:
    """pytest's final counts line ("35 passed, 2 skipped"), or "" if it printed none."""
    for line in reversed(lines):
        m = PYTEST_SUMMARY.match(line.strip())
        if m:
            return m.group(1)
    return ""


@dataclass(frozen=True)
class Stage:
    """One program run inside a built chapter: its main, or pytest over its test modules."""
    name: str  # for messages: "main" or "测试"
    args: list[str]  # after run_main.py and the tree: a script, or -m and a module


def _violations(log: Path) -> list[str]:
    seen = dict.fromkeys(log.read_text(encoding="utf-8").splitlines() if log.exists() else [])
    problems = []
    for entry in seen:
        name, where, who = entry.split("\t")
        problems.append(f"越界导入 {name}（来自 {where}{'，在子进程中' if who == 'child' else ''}）")
    return problems


def check_chapter(root: Path, ch: Chapter, verbose: bool = False, timeout: float | None = None,
                  shared_cpus: bool = False) -> Outcome:
    """Build chapter ch in a temporary directory and run, with the isolation guard on, its main
    and then its own test modules there (so both see only the chapter's tree)."""
    kinds = list(touched(root, ch).values())
    out = Outcome(ch, kinds.count("new"), kinds.count("modified"), len(ch.early))
    problems = static_problems(root, ch)
    if not ch.main.is_file():
        out.error = "；".join(problems)
        return out
    with tempfile.TemporaryDirectory(prefix=f"minisgl-{ch.name}-") as tmp:
        tree, boot = Path(tmp, "tree"), Path(tmp, "boot")
        build(root, ch.n, tree)
        # Compiled once here, not in each of the chapter's processes: where the environment
        # says PYTHONDONTWRITEBYTECODE (as CI's does) no process keeps its compilation, and
        # every one (main, pytest, each server, rank and tokenizer child) would compile the
        # package again, about 0.1 s of CPU each, hundreds of times in a check.
        compileall.compile_dir(tree, quiet=1)
        boot.mkdir()
        shutil.copyfile(TOOLS / "step_guard.py", boot / "_minisgl_step_guard.py")
        shutil.copyfile(TOOLS / "step_runner.py", boot / "run_main.py")
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        stages = [Stage("main", ["main.py"])]
        if (tree / "tests").is_dir():
            stages.append(Stage("测试", ["-m", "pytest", "-q", "-rfE"]))
        start = time.monotonic()
        for i, stage in enumerate(stages):
            log = Path(tmp, f"violations-{i}.log")
            cmd = [sys.executable, str(boot / "run_main.py"), str(tree), *stage.args]
            rc, stdout, lines = _run(cmd, tree, _guarded_env(tree, boot, log, shared_cpus), verbose,
                                      timeout)
            failed = _violations(log)
            if rc is None:
                failed.append(f"超时（{timeout:g} 秒）")
            elif rc != 0:
                failed.append(f"退出码 {rc}")
            if stage.name == "main":
                out.stdout, out.output = stdout, tuple(lines)
            else:
                out.tests = _pytest_summary(lines)
            if failed:
                problems += [f"{stage.name}：{p}" for p in failed]
                out.ran_failed, out.output = True, tuple(lines)
                break  # the tests of a chapter whose main fails would only repeat the failure
        out.seconds = time.monotonic() - start
    out.error = "；".join(problems)
    return out


# --------------------------------------------------------------------------- reporting


def _width(s: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def format_table(rows: list[list[str]]) -> str:
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell + " " * (w - _width(cell)) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def outcome_table(outcomes: list[Outcome]) -> str:
    rows = [["章节", "标题", "新建", "修改", "提前", "本章测试", "秒", "结果"]]
    rows += [[o.chapter.name, o.chapter.title, str(o.new), str(o.modified), str(o.early), o.tests or "—",
              f"{o.seconds:.1f}", "通过" if o.passed else f"失败：{o.error}"] for o in outcomes]
    return format_table(rows)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "未安装"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_line() -> str:
    return (f"# 运行于 {date.today():%Y-%m-%d} · {_cpu_model()} · {os.cpu_count()} 个逻辑核 · "
            f"Python {platform.python_version()} · {_torch_and_gpu()} · "
            f"transformers {_version('transformers')}")


def _torch_and_gpu() -> str:
    """torch's own version string (it names the CUDA build), and on a GPU the GPU and the
    FlashInfer release the GPU chapters run with."""
    try:
        import torch
    except ImportError:
        return "torch 未安装"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__}"
    return (f"torch {torch.__version__} · GPU {torch.cuda.get_device_name()} · "
            f"flashinfer-python {_version('flashinfer-python')}")


def record(root: Path, o: Outcome) -> Path:
    """Save a passing chapter's stdout for the book's 测试与运行结果 section."""
    path = root / "book" / "runs" / f"{o.chapter.name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{machine_line()}\n\n{o.stdout}", encoding="utf-8")
    return path


def _progress(line: str, live: bool) -> None:
    if live:
        sys.stderr.write("\r\033[K" + line)
        sys.stderr.flush()
    else:
        print(line, file=sys.stderr, flush=True)


@contextmanager
def _ctrl_c_sets() -> Iterator[threading.Event]:
    """An event that Ctrl-C sets instead of raising KeyboardInterrupt, so that the signal never
    lands inside the pool's locks (the main thread only, where Python runs signal handlers)."""
    interrupted = threading.Event()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield interrupted  # Ctrl-C is someone else's business here (or ignored)
        return
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def default_jobs() -> int:
    """Chapters checked at once: the CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _longest_first(root: Path, selected: list[Chapter]) -> list[Chapter]:
    """Start order for the pool: chapters with the most test code first (their tests take the
    longest), so that no long chapter starts last and keeps the run going alone."""
    size = {ch.n: sum(p.stat().st_size for p in chapter_tests(root, ch.n)) for ch in selected}
    return sorted(selected, key=lambda ch: -size[ch.n])


def check(root: Path, specs: Sequence[str] = (), save: bool = False, verbose: bool = False,
          timeout: float | None = None, jobs: int | None = None) -> int:
    """The `check` command: run the chosen chapters (all by default), `jobs` at a time (each in
    its own temporary tree, as alone); 0 when everything passed."""
    selected = [find_chapter(root, s) for s in specs] or chapters(root)
    stale = link_problems(root)
    live = sys.stderr.isatty() and not verbose
    # verbose streams each chapter's output as it comes: one chapter at a time keeps it readable.
    jobs = 1 if verbose else max(1, min(jobs or default_jobs(), len(selected) or 1))
    outcomes: dict[int, Outcome] = {}
    _STOPPED.clear()
    with ThreadPoolExecutor(jobs) as pool, _ctrl_c_sets() as interrupted:
        pending = {pool.submit(check_chapter, root, ch, verbose, timeout, jobs > 1)
                   for ch in _longest_first(root, selected)}
        try:
            while pending and not interrupted.is_set():
                # A timed wait: the main thread comes back to Python often enough to run the
                # SIGINT handler even when the kernel delivered the signal to a worker thread.
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for future in finished:
                    o = future.result()
                    outcomes[o.chapter.n] = o
                    _progress(f"[{len(outcomes)}/{len(selected)}] {o.chapter.name} "
                              f"{'通过' if o.passed else '失败'}（{o.seconds:.0f} 秒）", live)
        finally:
            if pending:  # Ctrl-C or an error: start nothing more, stop what runs
                for future in pending:
                    future.cancel()
                _stop_all()
    if interrupted.is_set():
        raise KeyboardInterrupt
    if live:
        sys.stderr.write("\r\033[K")
    ordered = [outcomes[ch.n] for ch in selected]
    for o in ordered:
        if o.ran_failed and not verbose:
            print(f"---- {o.chapter.name}：失败时的全部输出 ----")
            print("".join(o.output).rstrip())
        if o.passed and save:
            print(f"已记录 {record(root, o).relative_to(root)}", file=sys.stderr)
    if stale:
        print(f"python/{PACKAGE} 不是所有章节的叠加（运行 python tools/steps.py link 重新生成）：")
        print("\n".join(f"  {p}" for p in stale))
    if ordered:
        print(outcome_table(ordered))
    return 1 if stale or not all(o.passed for o in ordered) else 0


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="steps.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root (default: %(default)s)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="build each chapter and run its main and its own tests there")
    c.add_argument("chapters", nargs="*", help="3, 03 or ch03_models (default: all)")
    c.add_argument("--record", action="store_true", help="save passing runs to book/runs/")
    c.add_argument("-v", "--verbose", action="store_true", help="stream main's output")
    c.add_argument("--timeout", type=float, help="seconds allowed per chapter")
    c.add_argument("-j", "--jobs", type=int, help="chapters checked at once (default: the usable CPUs)")
    for name, text in [("tree", "annotated file tree of a chapter"), ("diff", "what a chapter changed")]:
        sub.add_parser(name, help=text).add_argument("chapter")
    b = sub.add_parser("build", help="copy a chapter's package, main, tests and example into DIR")
    b.add_argument("chapter")
    b.add_argument("dir", type=Path)
    sub.add_parser("link", help=f"regenerate python/{PACKAGE} from steps/")
    sys.path.insert(0, str(TOOLS))  # when this file was imported by path (tests, the book's hook)
    import exercises  # the exercise command builds on this module, so it lives in its own
    exercises.add_command(sub)
    args = parser.parse_args(argv)
    root: Path = args.root
    try:
        if args.cmd == "exercise":
            return exercises.command(root, args)
        if args.cmd == "check":
            return check(root, args.chapters, args.record, args.verbose, args.timeout, args.jobs)
        if args.cmd == "link":
            print("\n".join(link(root)) or f"python/{PACKAGE} 已是最新")
        elif args.cmd in ("tree", "diff"):
            n = find_chapter(root, args.chapter).n
            text = render_tree(root, n) if args.cmd == "tree" else render_diff(root, n)
            sys.stdout.write(text or "（这一章没有改动任何包文件）\n")
        elif args.cmd == "build":
            ch = find_chapter(root, args.chapter)
            build(root, ch.n, args.dir)
            example = chapter_example(root, ch)
            print(f"第 {ch.n} 章搭好了：{args.dir}。在那个目录里运行：\n  python main.py"
                  + ("\n  python -m pytest -q" if (args.dir / "tests").is_dir() else "")
                  + (f"\n  PYTHONPATH=. python examples/{example.name}" if example else ""))
    except StepsError as e:
        print(f"steps.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
