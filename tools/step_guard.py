"""Step isolation guard, imported first in every Python process of a `tools/steps.py check`.

The checker copies this file into a boot directory as `_minisgl_step_guard`; the runner and,
through a generated sitecustomize, every child process (multiprocessing spawn, `python -m
minisgl`) import it. A `minisgl` module that would come from outside the chapter's own tree
raises ImportError and is also logged to a file, so a main that swallows the error, or a child
whose exit code is lost, still fails the chapter. Not meant to be imported anywhere else.
"""

import atexit
import os
import sys

TREE = os.path.realpath(os.environ["MINISGL_STEP_TREE"])
LOG = os.environ.get("MINISGL_STEP_LOG")

def _ours(name):
    return name == "minisgl" or name.startswith("minisgl.")

def _inside(path):
    return os.path.realpath(path).startswith(TREE + os.sep)

def _violation(name, where):
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            in_main = os.environ.get("MINISGL_STEP_MAIN_PID") == str(os.getpid())
            f.write(f"{name}\t{where}\t{'main' if in_main else 'child'}\n")
    msg = f"step isolation: {name!r} would come from {where}, outside this chapter's tree {TREE}"
    print(msg, file=sys.stderr)
    return msg


class StepGuard:
    """First on sys.meta_path: let the other finders resolve a minisgl module, then veto it if
    it lives outside the tree (a later chapter, python/minisgl, an editable install)."""

    def find_spec(self, name, path, target=None):
        if not _ours(name):
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        else:
            return None
        places = [spec.origin] if spec.has_location else list(spec.submodule_search_locations or [])
        outside = [p for p in places if not _inside(p)] or ([] if places else ["<no file>"])
        if outside:
            raise ImportError(_violation(name, outside[0]), name=name)
        return spec


@atexit.register
def _sweep():
    # Catches modules that skipped the finders (spec_from_file_location + sys.modules).
    for name, mod in list(sys.modules.items()):
        where = getattr(mod, "__file__", None)
        if _ours(name) and where and not _inside(where):
            _violation(name, where)


sys.meta_path.insert(0, StepGuard())
