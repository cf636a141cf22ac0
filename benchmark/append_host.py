"""Host cost of appending one sampled token to a request: chapter 1's `Req.append_host` (a
`torch.cat` of the whole sequence) against chapter 17's (a write into room kept for the tokens),
side by side in one run. The scheduler calls it once per request per decode step, so at a batch
of 256 the difference is paid 256 times a step.

    python benchmark/append_host.py [--prompt 1024] [--tokens 256] [--requests 64]

Each chapter's own tree is built (tools/steps.py build) and timed in a process of its own, on one
thread, with the same prompts.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMER = """
import sys, time, torch
torch.set_num_threads(1)
from minisgl.core import Req, SamplingParams
prompt, tokens, requests = map(int, sys.argv[1:4])
reqs = [Req(torch.arange(prompt, dtype=torch.int32), table_idx=i, cached_len=0, output_len=tokens,
            uid=i, sampling_params=SamplingParams(max_tokens=tokens)) for i in range(requests)]
start = time.perf_counter()
for step in range(tokens):
    for req in reqs:
        req.append_host(step)
spent = time.perf_counter() - start
assert all(r.input_ids[prompt:].tolist() == list(range(tokens)) for r in reqs)
print(spent / (tokens * requests) * 1e6)
"""


def time_chapter(n: int, prompt: int, tokens: int, requests: int) -> float:
    with tempfile.TemporaryDirectory() as tree:
        subprocess.run([sys.executable, str(ROOT / "tools" / "steps.py"), "build", str(n), tree],
                       check=True, capture_output=True)
        out = subprocess.run([sys.executable, "-c", TIMER, str(prompt), str(tokens), str(requests)],
                             cwd=tree, env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"},
                             check=True, capture_output=True, text=True)
    return float(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens of each request")
    p.add_argument("--tokens", type=int, default=256, help="tokens appended to each request")
    p.add_argument("--requests", type=int, default=64)
    a = p.parse_args()
    print(f"每个请求的提示词 {a.prompt} 个 token，追加 {a.tokens} 个，{a.requests} 个请求（微秒/次）")
    before = time_chapter(1, a.prompt, a.tokens, a.requests)
    after = time_chapter(17, a.prompt, a.tokens, a.requests)
    print(f"  第 1 章（torch.cat）     {before:6.2f}")
    print(f"  第 17 章（写进预留的位置） {after:6.2f}   快 {before / after:.1f} 倍")


if __name__ == "__main__":
    main()
