"""Session 24's repro: in `offline.py --ablate cuda-graph`, the second engine of the process
(CUDA graphs off, built after the first one ran the official workload and shut down) hit an
illegal memory access in its warm-up prefill. This runs offline.py as it is, with the engine's
warm-up wrapped to say what it is about to do: the engine's pages, max_seq_len, and the device
memory free and reserved at that moment.

    python benchmark/h200/repro_warm_up.py --ablate cuda-graph --skip-transformers ...
"""

import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]
from minisgl.engine import engine as engine_module  # noqa: E402

warm_up = engine_module.Engine.warm_up


def saying_warm_up(self, num_tokens: int) -> None:  # type: ignore[no-untyped-def]
    free, total = torch.cuda.mem_get_info(self.device)
    print(f"warm-up of {num_tokens} tokens: {self.num_pages} pages of {self.page_size}, "
          f"max_seq_len {self.max_seq_len}, graphs {self.graphs is not None}, free "
          f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB, reserved by torch "
          f"{torch.cuda.memory_reserved() / 2**30:.1f} GiB", flush=True)
    warm_up(self, num_tokens)
    print("warm-up done", flush=True)


engine_module.Engine.warm_up = saying_warm_up  # type: ignore[method-assign]
sys.argv = [str(ROOT / "benchmark/offline.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
