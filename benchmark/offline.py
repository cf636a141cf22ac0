"""离线吞吐：我们的 LLM.generate 对比 transformers 的批量 generate，同一次运行里并排测。

两种负载：
- cpu（CPU 上的默认）：官方 offline 基准的缩小版。32 个请求，提示词 16–256、输出 16–128
  （固定种子随机抽取，提示词是随机 token），贪心，ignore_eos；另测关掉重叠调度、关掉 radix cache
  两个变体；同一次运行里轮流测 --rounds 轮，每项取最快的一轮。
- official（--device cuda 时的默认）：官方 benchmark/offline/bench.py 的负载，原样抽取：
  random.seed(0)，256 个请求，提示词 randint(100, 1024) 个 randint(0, 10000) 的 token，
  输出长度 randint(100, 1024)，temperature 0.6，ignore_eos，共 133,966 个输出 token；
  page_size 256、max_seq_len 4096，与官方对齐。--attn 列出的每个注意力后端各测一次。

吞吐 = 请求要的输出 token 总数 / 墙钟时间。transformers 一次 generate 整个 batch：提示词左侧
填充到一样长，所有行都生成到最长的那个输出长度，多生成的不计入吞吐。

    python benchmark/offline.py                # CPU
    python benchmark/offline.py --device cuda --model models/qwen3-0.6b-random
    python benchmark/offline.py --device cuda --model models/qwen3-0.6b-random --tp 1 2 \
        --skip-transformers
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


def columns(text: str) -> int:
    """Terminal columns of text: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int) -> str:
    return text + " " * max(0, width - columns(text))


def workload(num_requests: int, seed: int, vocab: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(16, 256))]
               for _ in range(num_requests)]
    output_lens = [rng.randint(16, 128) for _ in range(num_requests)]
    return prompts, output_lens


def official_workload() -> tuple[list[list[int]], list[int]]:
    """The draw of the official benchmark/offline/bench.py, call for call."""
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))]
               for _ in range(256)]
    return prompts, [random.randint(100, 1024) for _ in range(256)]


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_ours(model: str, prompts: list[list[int]], output_lens: list[int], dtype: torch.dtype,
             temperature: float = 0.0, **options) -> float:
    llm = LLM(model, dtype=dtype, max_running_req=len(prompts), **options)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature)
              for n in output_lens]
    # Warm-up (as the official script does): kernels' first launches and JIT loading.
    llm.generate([prompts[0][:50]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, progress=False)
    elapsed = time.perf_counter() - start
    assert [len(o["token_ids"]) for o in outputs] == output_lens
    llm.shutdown()
    release_memory()
    return elapsed


def run_transformers(model: str, prompts: list[list[int]], output_lens: list[int],
                     pad_id: int, device: str, dtype: torch.dtype) -> float:
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
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
    release_memory()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda, for both engines")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds; each config keeps its best (default: 2 on CPU, 1 on GPU)")
    parser.add_argument("--workload", choices=["cpu", "official"], default=None,
                        help="default: official on cuda, cpu on the CPU")
    parser.add_argument("--attn", nargs="+", default=None,
                        help="attention backends to measure (default: torch on the CPU; "
                             "torch flashinfer fa on cuda)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="default: bfloat16 on cuda, float32 on the CPU")
    parser.add_argument("--ablate", nargs="*", default=None,
                        help="features to turn off, each a row of its own: overlap, radix, "
                             "cuda-graph, or several joined by + (overlap+cuda-graph) "
                             "(default: overlap and radix on the CPU workload, none on official)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1],
                        help="tensor-parallel sizes of our engine, each a row of its own "
                             "(transformers stays on one device)")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    workload_name = args.workload or ("official" if gpu else "cpu")
    rounds = args.rounds or (1 if gpu else 2)
    attns = args.attn or (["torch", "flashinfer", "fa"] if gpu else ["torch"])
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))

    if workload_name == "official":
        prompts, output_lens = official_workload()
        options = dict(page_size=256, max_seq_len_override=4096, max_prefill_length=16384,
                       device=args.device, temperature=0.6)
    else:
        vocab = AutoConfig.from_pretrained(args.model).vocab_size
        prompts, output_lens = workload(args.num_requests, args.seed, vocab)
        options = dict(num_page_override=16384, max_seq_len_override=512, page_size=1,
                       device=args.device)
    total_out = sum(output_lens)
    print(f"{len(prompts)} 个请求，提示词 {sum(map(len, prompts))} 个 token"
          f"（{min(map(len, prompts))}–{max(map(len, prompts))}），要求输出 {total_out:,} 个 token"
          f"（{min(output_lens)}–{max(output_lens)}），模型 {Path(args.model).name}，"
          f"{str(dtype).removeprefix('torch.')}，{args.device}")
    if workload_name == "official" and total_out != 133_966:
        print(f"负载与官方不一致：输出 token 总数应为 133,966，这里是 {total_out:,}")
        return 1

    def ours(**extra):
        return lambda: run_ours(args.model, prompts, output_lens, dtype, **{**options, **extra})

    def label(attn: str, tp: int) -> str:  # name what varies between the rows
        varies = [f"--attn {attn}"] * (len(attns) > 1) + [f"TP={tp}"] * (len(args.tp) > 1)
        return "我们：" + (" ".join(varies) or "LLM.generate")

    configs = [(label(name, tp), ours(attention_backend=name, tp_size=tp))
               for name in attns for tp in args.tp]
    ablate = args.ablate if args.ablate is not None else (
        ["overlap", "radix"] if workload_name == "cpu" else [])
    ablations = {"overlap": ("重叠调度", dict(overlap=False)),
                 "radix": ("radix cache", dict(cache_type="naive")),
                 "cuda-graph": ("CUDA Graph", dict(cuda_graph="off"))}
    for combination in ablate:  # with the first backend of --attn
        features = combination.split("+")
        if unknown := [f for f in features if f not in ablations]:
            parser.error(f"--ablate: unknown feature {unknown[0]!r}; choose from {list(ablations)}")
        off = "、".join(ablations[f][0] for f in features)
        name = "我们：关掉" + ("" if off[0] > "\u2e80" else " ") + off  # a space before Latin
        option = {k: v for f in features for k, v in ablations[f][1].items()}
        configs.append((name, ours(attention_backend=attns[0], tp_size=args.tp[0], **option)))
    if not args.skip_transformers:
        configs.append(("transformers 批量 generate", lambda: run_transformers(
            args.model, prompts, output_lens, 2, args.device, dtype)))
    # Every configuration once per round, in turn; each keeps its best round, so a burst of
    # load from elsewhere on the machine cannot decide the comparison.
    times: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds):
        for (name, run), measured in zip(configs, times):
            measured.append(run())
            print(f"  ……{name}：{measured[-1]:.1f}s", file=sys.stderr, flush=True)
    rows = [(name, min(measured)) for (name, _), measured in zip(configs, times)]
    width = max(28, *(columns(name) + 2 for name, _ in rows))
    baseline = rows[-1][1]  # transformers, or with --skip-transformers the last of ours
    print(f"  {pad('', width)}{pad('用时', 10)}{pad('输出 token/s', 14)}"
          f"相对{rows[-1][0].removeprefix('我们：')}")
    for name, seconds in rows:
        print(f"  {pad(name, width)}{pad(f'{seconds:.1f}s', 10)}{pad(f'{total_out / seconds:,.1f}', 14)}"
              f"{baseline / seconds:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
