"""Runs one program of a built chapter in place, with the isolation guard on (copied next to the
guard by `tools/steps.py check`). Arguments: the chapter's tree, then either a script (main.py)
or `-m MODULE ARGS...` (pytest over the chapter's own test modules)."""

import os
import runpy
import sys

import _minisgl_step_guard  # sitecustomize installed it already; this makes sure
os.environ["MINISGL_STEP_MAIN_PID"] = str(os.getpid())  # tells the guard this process from its children
tree, args = sys.argv[1], sys.argv[2:]
sys.path[0] = tree  # where `python main.py` or `python -m ...` run from the tree would put it
if args[0] == "-m":
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
