"""python -m minisgl --model PATH: the OpenAI-compatible server (see --help)."""

import sys

from minisgl.server.launch import main

if __name__ == "__main__":
    sys.exit(main())
