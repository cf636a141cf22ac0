"""What every benchmark script prints alike: columns that line up with Chinese text in them, the
machine line that heads a recorded run, the --json / --plot outputs, and how a run that starts a
server ends when it is interrupted or fails."""

from __future__ import annotations

import json
import signal
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def columns(text: str) -> int:
    """Terminal columns of text: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int) -> str:
    return text + " " * max(0, width - columns(text))


def aligned(rows: list[list[str]]) -> str:
    """Rows of cells as a table: columns aligned (CJK counted double), indented two spaces."""
    widths = [max(columns(row[i]) for row in rows) + 2 for i in range(len(rows[0]))]
    return "\n".join("  " + "".join(pad(cell, w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def machine_line() -> str:
    """The first line of a recorded run (the same one tools/steps.py writes)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from steps import machine_line as line
    finally:
        sys.path.pop(0)
    return line()


def save(report: dict, json_path: str | None, plot_path: str | None,
         plot: Callable[[dict, str], None]) -> None:
    """--json, then --plot: the numbers are on disk before a plot can fail."""
    if json_path:
        Path(json_path).write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n",
                                   encoding="utf-8")
        print(f"JSON：{json_path}")
    if plot_path:
        plot(report, plot_path)
        print(f"图：{plot_path}")


def run_to_exit_code(body: Callable[[], int]) -> int:
    """body()'s exit code. SIGTERM (a job killed by its runner) unwinds like Ctrl-C, through
    the `finally` that stops the server; an interruption is 130, a RuntimeError (the server
    could not start, or died) its message and 1."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return body()
    except KeyboardInterrupt:
        print("中断：服务器已停止", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"失败：{e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
