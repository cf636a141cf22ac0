"""Session 24's repro: the second engine of a process, built after the first one shut down,
hit an illegal memory access in its warm-up prefill when its CUDA graphs were off (the
ablation table's third row). Builds engine A with the first options, generates, shuts it down
as offline.py does, then engine B with the second; run under CUDA_LAUNCH_BLOCKING=1 the
traceback names the launch that faulted.

    python benchmark/h200/repro_warm_up.py "dict()" "dict(cuda_graph='off')"
"""

import gc
import sys
import traceback

import torch

sys.path.insert(0, "python")
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

for n, opts in enumerate(map(eval, sys.argv[1:])):
    try:
        llm = LLM("models/qwen3-0.6b-random", dtype=torch.bfloat16, max_running_req=256,
                  page_size=256, **opts)
        engine = llm.backend.scheduler.engine
        print(f"engine {n} {opts}: built; max_seq_len {engine.max_seq_len}, pages "
              f"{engine.num_pages}", flush=True)
        out = llm.generate([[1, 2, 3] * 20], SamplingParams(max_tokens=4, ignore_eos=True),
                           progress=False)
        print("  generated", out[0]["token_ids"], flush=True)
        llm.shutdown()
        gc.collect()
        torch.cuda.empty_cache()
    except Exception:
        traceback.print_exc(limit=-8)
        break
