"""Watching real processes from tests: a child's output, its children, whether they are gone."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180.0  # seconds until a server says "ready"; tiny models need a few


def package_root() -> Path:
    """The directory holding the `minisgl` this process imported: python/ in the repository,
    a chapter's tree under tools/steps.py check. Not resolved: python/minisgl's files are links."""
    import minisgl

    return Path(os.path.abspath(minisgl.__file__)).parent.parent


def model_that_never_loads(source: Path, directory: Path) -> Path:
    """A copy of checkpoint `source` whose weights file is a FIFO nobody writes to: a process
    that loads it blocks in open(), so a server started on it is still loading whenever a test
    acts. A real model's load, however small, can finish before the test acts (it did once the
    ranks were forked from a forkserver that had torch already)."""
    model = directory / source.name
    shutil.copytree(source, model, ignore=shutil.ignore_patterns("*.safetensors"))
    os.mkfifo(model / "model.safetensors")
    return model


def minisgl_env() -> dict[str, str]:
    """The environment with this process's own package first on PYTHONPATH, so a child runs
    the same tree as the test that starts it."""
    path = [str(package_root()), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has exited; only its parent has not collected it)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def descendants_of(pid: int) -> list[int]:
    """Every process below `pid`: its children, theirs, and so on. A launcher's workers are
    children of its forkserver, not of the launcher."""
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return ""


def workers_of(pid: int) -> list[int]:
    """The processes `pid` started through multiprocessing (ranks, tokenizers), oldest first:
    the children of its forkserver, or its own children that were spawned. Not the forkserver
    itself, nor the resource tracker."""
    started = []
    for child in children_of(pid):
        command = cmdline(child)
        if "multiprocessing.forkserver" in command:
            started += children_of(child)
        elif "spawn_main" in command:
            started.append(child)
    found = [(int(stat[19]), p) for p in started if (stat := proc_stat(p)) is not None]
    return [p for _, p in sorted(found)]  # field 22 of stat: start time


def wait_all_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still running after `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if running(p)]
    return alive


def modified_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except FileNotFoundError:  # removed between listing and looking
        return False


class Child:
    """A subprocess whose output a thread reads into `lines`, so the pipe never fills up and
    the test can wait for a given line."""

    def __init__(self, argv: list[str], stdin: bool = False) -> None:
        self.started = time.time()
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=minisgl_env(), text=True, bufsize=1,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.children: list[int] = []

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def output(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = START_TIMEOUT) -> None:
        """Until some output line contains `text`; fails if the process exits first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(text in line for line in self.lines):
                if not self.reader.is_alive() or self.popen.poll() is not None:
                    pytest.fail(f"exited ({self.popen.poll()}) before printing {text!r}:\n"
                                f"{''.join(self.lines)}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no {text!r} after {timeout:.0f} s:\n{''.join(self.lines)}")
                self.changed.wait(0.2)

    def served_url(self) -> str:
        """The server's base URL, from its ready line. Servers in tests listen on --port 0: a
        port picked by the test and bound later by the server could be taken in between by
        any process of the parallel run (an outgoing connection's ephemeral port, too)."""
        self.wait_for("minisgl: ready")
        match = re.search(r" at (http://\S+)/v1 ", self.output)
        assert match, self.output
        return match.group(1)

    def wait(self, timeout: float) -> int:
        """The exit code; SIGKILL and fail if it has not come within `timeout` seconds."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            pytest.fail(f"did not exit within {timeout} s:\n{self.output}")
        self.reader.join(5)
        return code

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send `sig` (unless it has exited already) and wait for the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        return self.wait(timeout)

    def socket_files(self) -> list[str]:
        """The IPC socket files of this launcher's run: their names start with its pid, and
        they are newer than it (an earlier process with the same pid may have left some)."""
        pattern = os.path.join(tempfile.gettempdir(), f"minisgl-{self.pid}-*")
        return [p for p in glob.glob(pattern) if modified_since(p, self.started)]


def run_example(name: str, timeout: float = 300.0) -> str:
    """Run examples/<name> as a reader does (`python examples/<name>` from the tree root), on
    this process's package; its stdout. Fails on a non-zero exit, or kills its whole session
    (any server or rank it started) after `timeout` seconds."""
    proc = subprocess.Popen([sys.executable, f"examples/{name}"], cwd=ROOT, env=minisgl_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"examples/{name} did not finish within {timeout:.0f} s:\n{out}{err}")
    assert proc.returncode == 0, f"examples/{name} exited with {proc.returncode}:\n{out}{err}"
    return out
