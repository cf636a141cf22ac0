"""离线吞吐：我们的 LLM.generate 对比 transformers 的批量 generate，同一次运行里并排测。

两种负载：
- cpu（CPU 上的默认）：官方 offline 基准的缩小版。32 个请求，提示词 16–256、输出 16–128
  （固定种子随机抽取，提示词是随机 token），贪心，ignore_eos；另测关掉重叠调度、关掉 radix cache
  两个变体；同一次运行里轮流测 --rounds 轮，每项取最快的一轮。KV pool 固定 16,384 个 token
  （页数 = 16,384 / page_size），page_size 1。
- official（--device cuda 时的默认）：官方 benchmark/offline/bench.py 的负载，原样抽取：
  random.seed(0)，256 个请求，提示词 randint(100, 1024) 个 randint(0, 10000) 的 token，
  输出长度 randint(100, 1024)，temperature 0.6，ignore_eos，共 133,966 个输出 token；
  page_size 256、max_seq_len 4096，与官方对齐。--attn 列出的每个注意力后端各测一次。

--ablate 的每一项单独成一行（用 --attn 的第一个后端）：overlap（关掉重叠调度）、cuda-graph、
custom-kernels（关掉第 19 章的自定义 kernel）、radix（换成不共享前缀的 naive cache）、
page-1 / page-16 / page-256（改 page_size；与负载默认值相同的那一行标"默认"）；用 + 连起来
是同时改几项（overlap+cuda-graph）。

吞吐 = 请求要的输出 token 总数 / 墙钟时间。transformers 一次 generate 整个 batch：提示词左侧
填充到一样长，所有行都生成到最长的那个输出长度，多生成的不计入吞吐。最后一行是比较的基准
（transformers，或者 --skip-transformers 时我们的最后一行）。

--json PATH 另存结果（机器、负载、每行的用时、输出 token/s、相对基准的倍数），--plot PATH
画一张横条图（PNG，每行的输出 token/s）；--from-json PATH 从存下的 JSON 重新打表、画图，
不再测。终端上每次测量显示进度条（按完成的请求更新；输出不是终端时不显示）。

    python benchmark/offline.py                # CPU
    python benchmark/offline.py --device cuda --model models/qwen3-0.6b-random
    python benchmark/offline.py --device cuda --model models/qwen3-0.6b-random --tp 1 2 \\
        --skip-transformers
    python benchmark/offline.py --device cuda --model models/qwen3-0.6b-random --attn fa \\
        --ablate overlap cuda-graph custom-kernels radix page-1 page-16 \\
        --json offline.json --plot offline.png
    python benchmark/offline.py --from-json offline.json --plot offline.png
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, StoppingCriteria

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from report import columns, machine_line, pad, save

ROOT = Path(__file__).resolve().parent.parent
CPU_POOL_TOKENS = 16384  # the CPU workload's KV pool: the same tokens at every page size
# Features --ablate changes: the Chinese name of what is turned off (or the page size), the
# short English key the plot falls back to without a CJK font, and the LLM options.
ABLATIONS: dict[str, tuple[str, str, dict]] = {
    "overlap": ("重叠调度", "no overlap", dict(overlap=False)),
    "radix": ("radix cache", "naive cache", dict(cache_type="naive")),
    "cuda-graph": ("CUDA Graph", "no CUDA graph", dict(cuda_graph="off")),
    "custom-kernels": ("自定义 kernel", "no custom kernels", dict(custom_kernels="off")),
    **{f"page-{n}": (f"page_size {n}", f"page {n}", dict(page_size=n)) for n in (1, 16, 256)},
}
# Fonts with Chinese glyphs, best first; without one the plot names rows by their English keys.
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei",
             "WenQuanYi Zen Hei", "Droid Sans Fallback", "Noto Sans CJK JP")




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


def ablation(combination: str, default_page: int) -> tuple[str, str, dict]:
    """Row name, English key and LLM options of an --ablate item such as overlap+page-16."""
    features = combination.split("+")
    if unknown := [f for f in features if f not in ABLATIONS]:
        raise ValueError(f"unknown feature {unknown[0]!r}; choose from {list(ABLATIONS)}")
    pages = [f for f in features if f.startswith("page-")]
    if len(pages) > 1:
        raise ValueError(f"{combination!r} sets the page size twice")
    # A page size equal to the workload's own says so, lest its row read as a change.
    default = {f: f in pages and ABLATIONS[f][2]["page_size"] == default_page for f in features}
    off = [ABLATIONS[f][0] for f in features if f not in pages]
    # One 关掉 for all that is turned off, with a space before a Latin name.
    names = ["关掉" + ("" if off[0] > "\u2e80" else " ") + "、".join(off)] if off else []
    names += [ABLATIONS[f][0] + "（默认）" * default[f] for f in pages]
    keys = [ABLATIONS[f][1] + " (default)" * default[f] for f in features]
    options = {k: v for f in features for k, v in ABLATIONS[f][2].items()}
    return "我们：" + "，".join(names), "ours: " + ", ".join(keys), options


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_ours(model: str, prompts: list[list[int]], output_lens: list[int], dtype: torch.dtype,
             progress: bool, temperature: float = 0.0, **options) -> float:
    llm = LLM(model, dtype=dtype, max_running_req=len(prompts), **options)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature)
              for n in output_lens]
    # Warm-up (as the official script does): kernels' first launches and JIT loading.
    llm.generate([prompts[0][:50]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)
    start = time.perf_counter()
    # The bar is redrawn as requests finish; it costs a counter update per token (~0.2 us),
    # under 0.5% of the official workload's run.
    outputs = llm.generate(prompts, params, progress=progress)
    elapsed = time.perf_counter() - start
    assert [len(o["token_ids"]) for o in outputs] == output_lens
    llm.shutdown()
    release_memory()
    return elapsed


class StepBar(StoppingCriteria):
    """A progress bar over generate's decode steps, as a stopping criterion that never stops:
    generate calls it once a step on the device's tensors, where a streamer would copy every
    step's tokens to the host."""

    def __init__(self, bar) -> None:
        self.bar = bar

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.bar.update(1)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def run_transformers(model: str, prompts: list[list[int]], output_lens: list[int],
                     pad_id: int, device: str, dtype: torch.dtype, progress: bool) -> float:
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    start = time.perf_counter()
    with torch.no_grad(), tqdm(total=max(output_lens), desc="transformers", unit="step",
                               disable=not progress) as bar:
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(output_lens),
                          eos_token_id=None, pad_token_id=pad_id, do_sample=False,
                          stopping_criteria=[StepBar(bar)] if progress else None)
        out.cpu()  # wait for the device
    elapsed = time.perf_counter() - start
    del hf
    release_memory()
    return elapsed



def table(report: dict) -> str:
    rows = report["rows"]
    width = max(28, *(columns(row["name"]) + 2 for row in rows))
    lines = [f"  {pad('', width)}{pad('用时', 10)}{pad('输出 token/s', 14)}"
             f"相对{report['baseline'].removeprefix('我们：')}"]
    for row in rows:
        seconds, speed = f"{row['seconds']:.1f}s", f"{row['output_tokens_per_s']:,.1f}"
        lines.append(f"  {pad(row['name'], width)}{pad(seconds, 10)}{pad(speed, 14)}"
                     f"{row['ratio']:.2f}x")
    return "\n".join(lines)


def cjk_font() -> str | None:
    """The first of CJK_FONTS that matplotlib finds installed."""
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONTS if name in installed), None)


def plot(report: dict, path: str) -> None:
    """Output tokens/s of every row as horizontal bars, value and ratio on each, in a PNG."""
    import matplotlib
    from matplotlib.figure import Figure  # without pyplot: Agg draws the PNG, no display needed

    font = cjk_font()
    if font is None:
        print(f"没有找到中文字体（{'、'.join(CJK_FONTS)} 都没有装），图里的行名用英文；"
              "Debian/Ubuntu 上 apt-get install fonts-wqy-microhei（或 fonts-noto-cjk）之后，"
              "可以用 --from-json 重画", file=sys.stderr)
    rows, w = report["rows"], report["workload"]
    speeds = [row["output_tokens_per_s"] for row in rows]
    with matplotlib.rc_context({"font.family": [font, "DejaVu Sans"] if font else "DejaVu Sans"}):
        fig = Figure(figsize=(9, 1.6 + 0.45 * len(rows)))
        ax = fig.add_subplot()
        bars = ax.barh(range(len(rows)), speeds,
                       color=["tab:blue"] * (len(rows) - 1) + ["tab:gray"])  # the baseline
        ax.set_yticks(range(len(rows)), [row["name" if font else "key"] for row in rows])
        ax.invert_yaxis()  # the table's order, top down
        ax.bar_label(bars, [f"{s:,.0f}  ({row['ratio']:.2f}x)" for s, row in zip(speeds, rows)],
                     padding=3, fontsize=9)
        ax.margins(x=0.25)  # room for the labels right of the longest bar
        ax.set_xlabel("输出 token/s" if font else "output tokens/s")
        what = (f"{w['name']} 负载：{w['requests']} 个请求，{w['output_tokens']:,} 个输出 token"
                if font else f"{w['name']} workload: {w['requests']} requests, "
                             f"{w['output_tokens']:,} output tokens")
        ax.set_title(f"{report['model']} · {w['dtype']} · {report['device_name']}\n{what}",
                     fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=150)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
                        help=f"features to change, each a row of its own: {', '.join(ABLATIONS)}; "
                             "or several joined by + (overlap+cuda-graph) "
                             "(default: overlap and radix on the CPU workload, none on official)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1],
                        help="tensor-parallel sizes of our engine, each a row of its own "
                             "(transformers stays on one device)")
    parser.add_argument("--trace", metavar="FILE", default=None,
                        help="one more row: our first configuration with trace=FILE, so tracing "
                             "on and off are measured in the same run (FILE keeps the last round)")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results")
    parser.add_argument("--plot", metavar="PATH", default=None,
                        help="draw output tokens/s per row into a PNG (needs matplotlib)")
    parser.add_argument("--from-json", metavar="PATH", default=None,
                        help="measure nothing: the table (and --plot) from a --json file")
    return parser


def measure(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
            ) -> dict | None:
    """Run every configuration; the report --json writes (None: the workload is not the
    official one)."""
    gpu = args.device.startswith("cuda")
    workload_name = args.workload or ("official" if gpu else "cpu")
    rounds = args.rounds or (1 if gpu else 2)
    attns = args.attn or (["torch", "flashinfer", "fa"] if gpu else ["torch"])
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    default_page = 256 if workload_name == "official" else 1
    ablate = args.ablate if args.ablate is not None else (
        ["overlap", "radix"] if workload_name == "cpu" else [])
    try:
        ablations = [ablation(combination, default_page) for combination in ablate]
    except ValueError as e:
        parser.error(f"--ablate: {e}")

    if workload_name == "official":
        prompts, output_lens = official_workload()
        options = dict(page_size=256, max_seq_len_override=4096, max_prefill_length=16384,
                       device=args.device, temperature=0.6)
    else:
        vocab = AutoConfig.from_pretrained(args.model).vocab_size
        prompts, output_lens = workload(args.num_requests, args.seed, vocab)
        options = dict(max_seq_len_override=512, page_size=1, device=args.device)
    total_out = sum(output_lens)
    description = (f"{len(prompts)} 个请求，提示词 {sum(map(len, prompts))} 个 token"
                   f"（{min(map(len, prompts))}–{max(map(len, prompts))}），要求输出 "
                   f"{total_out:,} 个 token（{min(output_lens)}–{max(output_lens)}），模型 "
                   f"{Path(args.model).name}，{str(dtype).removeprefix('torch.')}，{args.device}")
    print(description)
    if workload_name == "official" and total_out != 133_966:
        print(f"负载与官方不一致：输出 token 总数应为 133,966，这里是 {total_out:,}")
        return None
    progress = sys.stderr.isatty()  # a bar in a log file would be a wall of carriage returns

    def ours(**extra):
        config = {**options, **extra}
        if workload_name == "cpu":  # sized in tokens: 16,384 pages of 256 would not fit in RAM
            config["num_page_override"] = CPU_POOL_TOKENS // config["page_size"]
        return lambda: run_ours(args.model, prompts, output_lens, dtype, progress, **config)

    def label(attn: str, tp: int) -> tuple[str, str]:  # name what varies between the rows
        varies = [f"--attn {attn}"] * (len(attns) > 1) + [f"TP={tp}"] * (len(args.tp) > 1)
        return ("我们：" + (" ".join(varies) or "LLM.generate"),
                "ours: " + (" ".join(varies) or "LLM.generate"))

    configs = [(*label(name, tp), ours(attention_backend=name, tp_size=tp))
               for name in attns for tp in args.tp]
    if args.trace:  # right after the same configuration untraced
        configs.insert(1, ("我们：trace 打开", "ours: traced",
                           ours(attention_backend=attns[0], tp_size=args.tp[0], trace=args.trace)))
    configs += [(name, key, ours(attention_backend=attns[0], tp_size=args.tp[0], **option))
                for name, key, option in ablations]  # with the first backend of --attn
    if not args.skip_transformers:
        configs.append(("transformers 批量 generate", "transformers generate",
                        lambda: run_transformers(args.model, prompts, output_lens, 2,
                                                 args.device, dtype, progress)))
    # Every configuration once per round, in turn; each keeps its best round, so a burst of
    # load from elsewhere on the machine cannot decide the comparison.
    times: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds):
        for (name, _, run), measured in zip(configs, times):
            measured.append(run())
            print(f"  ……{name}：{measured[-1]:.1f}s", file=sys.stderr, flush=True)
    baseline = min(times[-1])  # transformers, or with --skip-transformers the last of ours
    return {
        "machine": machine_line(), "argv": argv,
        "model": Path(args.model).name, "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if gpu else "CPU",
        "workload": {"name": workload_name, "description": description,
                     "requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
                     "output_tokens": total_out, "dtype": str(dtype).removeprefix("torch."),
                     "temperature": options.get("temperature", 0.0),
                     "page_size": default_page, "rounds": rounds},
        "baseline": configs[-1][0],
        "rows": [{"name": name, "key": key, "seconds": min(measured), "rounds_s": measured,
                  "output_tokens_per_s": total_out / min(measured),
                  "ratio": baseline / min(measured)}
                 for (name, key, _), measured in zip(configs, times)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        print(report["workload"]["description"])
    elif (report := measure(parser, args, sys.argv[1:] if argv is None else argv)) is None:
        return 1
    print(table(report))
    save(report, args.json, args.plot, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
