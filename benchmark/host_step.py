"""Two pieces of a decode step's host work that the scheduler does once per request, each timed
in the chapter that wrote it first and in the chapter that made it cheap, side by side in one run:

- appending the sampled token: chapter 1's `Req.append_host` (a `torch.cat` of the whole
  sequence) against chapter 17's (a write into room kept for the tokens);
- encoding the step's replies for the detokenizer (one BatchMsg of one DetokenizeMsg per
  request): chapter 12's codec against chapter 13's (scalars first, field names looked up once).

    python benchmark/host_step.py [--batch 256] [--prompt 1024] [--steps 64]

Each chapter's own tree is built (as `tools/steps.py build` does) and timed in a process of its own, on
one thread, with the same inputs; microseconds per request.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from steps import build  # noqa: E402  (the step checker's own chapter builder)

APPEND = """
import sys, time, torch
torch.set_num_threads(1)
from minisgl.core import Req, SamplingParams
batch, prompt, steps = map(int, sys.argv[1:4])
reqs = [Req(torch.arange(prompt, dtype=torch.int32), table_idx=i, cached_len=0, output_len=steps,
            uid=i, sampling_params=SamplingParams(max_tokens=steps)) for i in range(batch)]
start = time.perf_counter()
for step in range(steps):
    for req in reqs:
        req.append_host(step)
spent = time.perf_counter() - start
assert all(r.input_ids[prompt:].tolist() == list(range(steps)) for r in reqs)
print(spent / (steps * batch) * 1e6)
"""

ENCODE = """
import sys, time
from minisgl.message.codec import decode, encode
from minisgl.message.messages import BatchMsg, DetokenizeMsg
batch, prompt, steps = map(int, sys.argv[1:4])
replies = BatchMsg([DetokenizeMsg(uid=i, next_token=1000 + i, finished=False)
                    for i in range(batch)])
assert decode(encode(replies)) == replies
start = time.perf_counter()
for _ in range(steps):
    encode(replies)
print((time.perf_counter() - start) / (steps * batch) * 1e6)
"""

PIECES = [("追加 token", APPEND, 1, 17, "torch.cat", "写进预留的位置"),
          ("编码回复", ENCODE, 12, 13, "逐个检查类型", "标量先走、字段名查一次")]


def time_in_chapter(n: int, code: str, args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tree:
        build(ROOT, n, Path(tree))
        out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, check=True,
                             env={"PYTHONPATH": tree}, capture_output=True, text=True)
    return float(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256, help="requests in the step")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens of each request")
    p.add_argument("--steps", type=int, default=64, help="steps timed")
    a = p.parse_args()
    args = [str(a.batch), str(a.prompt), str(a.steps)]
    print(f"batch {a.batch}，每个请求的提示词 {a.prompt} 个 token，计时 {a.steps} 步（微秒/请求）")
    for name, code, before, after, how_before, how_after in PIECES:
        slow, fast = time_in_chapter(before, code, args), time_in_chapter(after, code, args)
        print(f"  {name}：第 {before} 章（{how_before}）{slow:.2f}，第 {after} 章（{how_after}）"
              f"{fast:.2f}，快 {slow / fast:.1f} 倍；batch {a.batch} 时每步省 "
              f"{(slow - fast) * a.batch / 1000:.2f} 毫秒")


if __name__ == "__main__":
    main()
