"""离线吞吐：官方 offline 基准的 CPU 缩小版，我们的 LLM.generate 对比 transformers 的批量 generate。

32 个请求，提示词长度 16–256、输出长度 16–128（固定种子随机抽取，提示词是随机 token），
ignore_eos。吞吐 = 请求要的输出 token 总数 / 墙钟时间。transformers 一次 generate 整个 batch：
提示词左侧填充到一样长，所有行都生成到最长的那个输出长度，多生成的不计入吞吐。另外测我们关掉
重叠调度、关掉 radix cache 的两个变体。同一次运行里轮流测 --rounds 轮，每项取最快的一轮。

    python benchmark/offline.py                # CPU
    python benchmark/offline.py --device cuda  # GPU：两边都在 GPU 上
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import unicodedata
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from minisgl.core import SamplingParams
from minisgl.llm import LLM

ROOT = Path(__file__).resolve().parent.parent


def pad(text: str, width: int) -> str:
    """Left-align for a terminal, where a CJK character takes two columns."""
    columns = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(0, width - columns)


def workload(num_requests: int, seed: int, vocab: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(16, 256))]
               for _ in range(num_requests)]
    output_lens = [rng.randint(16, 128) for _ in range(num_requests)]
    return prompts, output_lens


def run_ours(model: str, prompts: list[list[int]], output_lens: list[int], **options) -> float:
    llm = LLM(model, dtype=torch.float32, max_running_req=len(prompts), **options)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, progress=False)
    elapsed = time.perf_counter() - start
    assert [len(o["token_ids"]) for o in outputs] == output_lens
    llm.shutdown()
    gc.collect()
    return elapsed


def run_transformers(model: str, prompts: list[list[int]], output_lens: list[int],
                     pad_id: int, device: str) -> float:
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(output_lens),
                          eos_token_id=None, pad_token_id=pad_id, do_sample=False)
        out.cpu()  # wait for the device
    elapsed = time.perf_counter() - start
    del hf
    gc.collect()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda, for both engines")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each config keeps its best")
    args = parser.parse_args()

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    prompts, output_lens = workload(args.num_requests, args.seed, vocab)
    total_out = sum(output_lens)
    print(f"{args.num_requests} 个请求，提示词 {sum(map(len, prompts))} 个 token"
          f"（{min(map(len, prompts))}–{max(map(len, prompts))}），要求输出 {total_out} 个 token"
          f"（{min(output_lens)}–{max(output_lens)}），模型 {Path(args.model).name}，float32，"
          f"{args.device}")
    options = dict(num_page_override=16384, max_seq_len_override=512, page_size=1,
                   device=args.device)
    configs = [
        ("我们：LLM.generate", lambda: run_ours(args.model, prompts, output_lens, **options)),
        ("我们：关掉重叠调度", lambda: run_ours(args.model, prompts, output_lens, overlap=False,
                                          **options)),
        ("我们：关掉 radix cache", lambda: run_ours(args.model, prompts, output_lens,
                                               cache_type="naive", **options)),
        ("transformers 批量 generate", lambda: run_transformers(args.model, prompts, output_lens,
                                                               2, args.device)),
    ]
    # Every configuration once per round, in turn; each keeps its best round, so a burst of
    # load from elsewhere on the machine cannot decide the comparison.
    best = [min(times) for times in zip(*[[run() for _, run in configs]
                                          for _ in range(args.rounds)])]
    rows = [(name, seconds) for (name, _), seconds in zip(configs, best)]
    baseline = rows[-1][1]
    print(f"  {pad('', 28)}{pad('用时', 10)}{pad('输出 token/s', 14)}相对 transformers")
    for name, seconds in rows:
        print(f"  {pad(name, 28)}{pad(f'{seconds:.1f}s', 10)}{pad(f'{total_out / seconds:.1f}', 14)}"
              f"{baseline / seconds:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
