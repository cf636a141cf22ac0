"""Runs one chapter's main.py in place, with the isolation guard on (copied next to the guard
by `tools/steps.py check`; arguments: the chapter's tree, then its main.py)."""

import os
import runpy
import sys

import _minisgl_step_guard  # sitecustomize installed it already; this makes sure
os.environ["MINISGL_STEP_MAIN_PID"] = str(os.getpid())  # tells the guard main from its children
tree, main = sys.argv[1], sys.argv[2]
sys.path[0] = tree  # where `python main.py` would put the script's directory
sys.argv = [main]
runpy.run_path(main, run_name="__main__")
