import sys, torch
sys.path.insert(0, "python")
from minisgl.llm import LLM
from minisgl.core import SamplingParams
opts = eval(sys.argv[1])
llm = LLM("models/qwen3-0.6b-random", dtype=torch.bfloat16, max_running_req=256, **opts)
eng = llm.backend.scheduler.engine
print(opts, "built; max_seq_len", eng.max_seq_len, "pages", eng.num_pages, flush=True)
out = llm.generate([[1, 2, 3] * 20], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)
print("generated", out[0]["token_ids"], flush=True)
