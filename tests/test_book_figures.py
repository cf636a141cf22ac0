"""Pictures and worked examples of the book that a script under tools/ produces: the committed
copies are what the scripts produce today."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

CHAPTER = None  # repository tooling, not a chapter: runs only in `make test`

ROOT = Path(__file__).resolve().parents[1]


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_butterfly_svg_is_the_scripts_output():
    butterfly = load_tool("draw_shuffle_butterfly")
    assert butterfly.OUT.read_text(encoding="utf-8") == butterfly.svg()


def test_lane0_gathers_every_lane_in_five_rounds():
    cone = load_tool("draw_shuffle_butterfly").sources_of_lane0()
    assert [len(c) for c in cone] == [32, 16, 8, 4, 2, 1]


def test_moe_align_example_is_the_recorded_output():
    recorded = (ROOT / "book" / "runs" / "ch20_align_example.txt").read_text(encoding="utf-8")
    header, command, *body = recorded.splitlines()
    assert header.startswith("# 运行于") and command == "$ python tools/moe_align_example.py"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "moe_align_example.py")],
                         capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == body
