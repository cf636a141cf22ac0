"""单个请求的 decode 速度：我们的 Engine 对比 transformers 自己的 greedy generate，同一次运行里测。

decode 速度 = (N - 1) / (生成 N 个 token 的时间 - 生成 1 个 token 的时间)，两边都这样算，
prefill 的时间因此被减掉。两边轮流测 --rounds 轮，取中位数。--threads 再按不同线程数测我们的
decode。

    python benchmark/decode_cpu.py --tokens 64 --threads 1,2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Phase, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.utils import physical_core_count, usable_cpu_count

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"


def ours(engine: Engine, prompt_ids: list[int], n: int) -> list[int]:
    """One request, greedy, n tokens: the hand-filled batches of chapter 6, one row, one page
    per token (page_size 1)."""
    req = Req(torch.tensor(prompt_ids, dtype=torch.int32), table_idx=0, cached_len=0,
              output_len=n, uid=0, sampling_params=SamplingParams(max_tokens=n))
    engine.page_table[0, : req.max_device_len] = torch.arange(req.max_device_len)
    phase: Phase = "prefill"
    while req.can_decode:
        batch = Batch([req], phase)
        batch.input_ids = req.input_ids[req.cached_len : req.device_len].to(engine.device).long()
        batch.positions = torch.arange(req.cached_len, req.device_len, device=engine.device)
        batch.out_loc = engine.page_table[0, req.cached_len : req.device_len].long()
        engine.attn_backend.prepare_metadata(batch)
        output = engine.forward_batch(batch, None)
        output.copy_done.synchronize()
        req.complete_one()
        req.append_host(int(output.next_tokens_host[0]))
        phase = "decode"
    return req.output_ids


def theirs(hf, prompt_ids: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt_ids], device=hf.device)
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                      eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def decode_seconds(generate, n: int) -> float:
    """Seconds that generating n tokens takes beyond generating 1: the n - 1 decode steps."""
    start = time.perf_counter()
    generate(1)
    middle = time.perf_counter()
    generate(n)
    return (time.perf_counter() - middle) - (middle - start)


def decode_rates(generators: list, n: int, rounds: int) -> list[float]:
    """Decode tokens/s of each generator: the median over `rounds`, taking turns within each
    round so that drift in the machine's speed hits all of them alike."""
    seconds: list[list[float]] = [[] for _ in generators]
    for _ in range(rounds):
        for times, generate in zip(seconds, generators):
            times.append(decode_seconds(generate, n))
    return [(n - 1) / statistics.median(times) for times in seconds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", default="", help="comma-separated thread counts to sweep")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds; the median counts")
    args = parser.parse_args()

    torch_default_threads = torch.get_num_threads()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompt_ids = tokenizer(PROMPT).input_ids
    engine = Engine(EngineConfig(args.model, device="cpu", max_running_req=1,
                                 num_page_override=1024, max_seq_len_override=1024))
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    print(f"CPU：{os.cpu_count()} 个逻辑核，{physical_core_count()} 个物理核，本进程可用 "
          f"{usable_cpu_count()} 个；PyTorch 默认 {torch_default_threads} 个线程，Engine 设为 "
          f"{engine.num_threads} 个")
    print(f"模型 {Path(args.model).name}，float32，提示词 {len(prompt_ids)} 个 token，"
          f"生成 {args.tokens} 个（greedy）")

    with torch.no_grad():
        our_tokens = ours(engine, prompt_ids, args.tokens)
        hf_tokens = theirs(hf, prompt_ids, args.tokens)
        ours_rate, hf_rate = decode_rates([lambda k: ours(engine, prompt_ids, k),
                                           lambda k: theirs(hf, prompt_ids, k)],
                                          args.tokens, args.rounds)
    print(f"  我们的 Engine            decode {ours_rate:7.1f} token/s")
    print(f"  transformers generate   decode {hf_rate:7.1f} token/s")
    print(f"  比值（我们 / transformers）     {ours_rate / hf_rate:7.2f}x，"
          f"两边生成的 token {'相同' if our_tokens == hf_tokens else '不同！'}")

    for threads in [int(t) for t in args.threads.split(",") if t]:
        torch.set_num_threads(threads)
        with torch.no_grad():
            (rate,) = decode_rates([lambda k: ours(engine, prompt_ids, k)], args.tokens,
                                   args.rounds)
        print(f"  {threads:3d} 个线程：我们的 decode {rate:7.1f} token/s")
    return 0 if our_tokens == hf_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
