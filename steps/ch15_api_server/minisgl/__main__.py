"""python -m minisgl --model PATH: the OpenAI-compatible server (see --help)."""

import gc
import sys

from minisgl.server.launch import main

if __name__ == "__main__":
    code = main()
    # Everything is stopped and closed by now. The interpreter's exit would still walk the
    # whole heap (torch, transformers) in its final garbage collections: about a second of CPU,
    # many seconds on a busy machine after Ctrl-C. Frozen objects are skipped.
    gc.freeze()
    sys.exit(code)
