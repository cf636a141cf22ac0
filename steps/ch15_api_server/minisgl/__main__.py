"""python -m minisgl --model PATH: the OpenAI-compatible server (see --help)."""

import gc
import sys

from minisgl.server.args import check_command_line

if __name__ == "__main__":
    # --help, --version and a mistaken command line answer here, before the server's imports
    # (torch, the backends: seconds); main() parses the same command line again, fully.
    check_command_line(sys.argv[1:])
    from minisgl.server.launch import main

    code = main()
    # Everything is stopped and closed by now. The interpreter's exit would still walk the
    # whole heap (torch, the engine) in its final garbage collections: over half a second of
    # CPU, seconds on a busy machine after Ctrl-C (chapter 15). Frozen objects are skipped.
    gc.freeze()
    sys.exit(code)
