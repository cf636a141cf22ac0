"""The scripts of benchmark/ as modules, for the tests of their pure parts and small runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmark"


def load_script(name: str) -> ModuleType:
    """benchmark/<name>.py imported as `<name>_bench`, with benchmark/ on sys.path while it runs
    its imports (the scripts import their neighbours, as they do when run as scripts)."""
    sys.path.insert(0, str(BENCHMARK))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCHMARK / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARK))
    return module
