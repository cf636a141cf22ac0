"""Decode speed with tensor parallelism: TP=1 against TP=N, at batch 1 and batch 32, in one run.

    python benchmark/tp_decode.py --model models/qwen3-0.6b-random --tp 1 2 --device cuda

Each request has a fixed random prompt; the decode rate is measured as the difference between
a run of 1 + D output tokens and a run of 1 output token (the prefill cancels out), repeated
--rounds times, best round kept. The radix cache is off, so the second run does not reuse the
first one's prompts. Settings are every combination of --cuda-graph, --custom-kernels and --tp;
TP=1 with the first of each runs first and is the reference: the greedy outputs of every other
setting are compared with its outputs at every batch size. --transformers adds a row per batch
for transformers' generate on the same prompts, timed the same way (its "graph" column says so).
"""

from __future__ import annotations

import argparse
import itertools
import platform
import time

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from offline import release_memory


def timed(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                        progress=False)
    return time.perf_counter() - start, [o["token_ids"] for o in outs]


def timed_transformers(hf, prompts: list[list[int]], max_tokens: int) -> float:
    ids = torch.tensor(prompts, device=hf.device)  # equal lengths: no padding
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                          min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        out.cpu()  # wait for the device
    assert out.shape[1] == ids.shape[1] + max_tokens
    return time.perf_counter() - start


def agreement(outs: list[list[int]], reference: list[list[int]]) -> str:
    """Either True, or False and how far the greedy outputs follow the reference. A request's
    tokens after its first divergence continue a different text, so they are not counted."""
    # Same lengths by construction (ignore_eos), so each first divergence is an index of both.
    firsts = [next((i for i, (x, y) in enumerate(zip(o, r)) if x != y), len(r))
              for o, r in zip(outs, reference)]
    diverging = [k for k, (first, r) in enumerate(zip(firsts, reference)) if first < len(r)]
    if not diverging:
        return "True"
    k = diverging[0]
    return (f"False: {sum(firsts):,} of {sum(map(len, reference)):,} tokens agree up to each "
            f"request's first divergence; {len(diverging)} of {len(reference)} requests diverge, "
            f"the first is request {k} at output token {firsts[k]}: {outs[k][firsts[k]]} here, "
            f"{reference[k][firsts[k]]} in the reference")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--attn", default="auto", help="attention backend (chapter 17)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    p.add_argument("--cuda-graph", nargs="+", default=["auto"], choices=["auto", "off", "emulate"],
                   help="decode graph modes to measure side by side (chapter 18)")
    p.add_argument("--custom-kernels", nargs="+", default=["auto"],
                   choices=["auto", "off", "emulate"],
                   help="our CUDA kernels on or off, side by side (chapter 19)")
    p.add_argument("--transformers", action="store_true",
                   help="also transformers' generate on the same prompts, measured the same way")
    a = p.parse_args()
    if 1 not in a.tp:
        p.error("--tp must include 1: the other sizes' outputs are compared with TP=1's")
    cuda = (a.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    dtype = getattr(torch, a.dtype or ("bfloat16" if cuda else "float32"))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (max(a.batch), a.prompt_len), generator=gen).tolist()
    device_name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    print(f"# {a.model} · {dtype} · {device_name} × {torch.cuda.device_count() if cuda else 1}"
          f" · torch {torch.__version__} · --attn {a.attn} · prompt {a.prompt_len}"
          f" · decode {a.decode} tokens")
    reference: dict[int, list[list[int]]] = {}  # the first setting's greedy outputs, by batch
    first = f"TP=1 --cuda-graph {a.cuda_graph[0]} --custom-kernels {a.custom_kernels[0]}"
    rows = []

    def add(row: tuple) -> None:  # said at once too: a run cut short keeps what it measured
        rows.append(row)
        tp, graph, kernels, batch, rate, ms = row
        print(f"measured: TP={tp} {graph} {kernels} batch {batch}: {ms:.2f} ms/step", flush=True)

    for graph, kernels, tp in itertools.product(a.cuda_graph, a.custom_kernels, sorted(set(a.tp))):
        setting = f"TP={tp} --cuda-graph {graph} --custom-kernels {kernels}"
        llm = LLM(a.model, dtype=dtype, device=a.device, tp_size=tp, cache_type="naive",
                  attention_backend=a.attn, cuda_graph=graph, custom_kernels=kernels,
                  max_running_req=max(a.batch), max_seq_len_override=a.prompt_len + a.decode + 8)
        try:
            engine = getattr(getattr(llm.backend, "scheduler", None), "engine", None)
            if engine is not None and getattr(engine, "graphs", None) is not None:
                print(f"{setting}: {len(engine.graphs.graphs)} graphs captured in "
                      f"{engine.graph_capture_seconds:.1f} s, "
                      f"{engine.graph_memory_bytes / 2**20:.0f} MiB")
            timed(llm, prompts[:2], 4)  # warm-up: allocator, kernels, the ranks' first steps
            for batch in a.batch:
                best = float("inf")
                for _ in range(a.rounds):
                    short, _ = timed(llm, prompts[:batch], 1)
                    long, outs = timed(llm, prompts[:batch], 1 + a.decode)
                    best = min(best, long - short)
                add((tp, graph, kernels, batch, batch * a.decode / best, best / a.decode * 1e3))
                if batch not in reference:
                    reference[batch] = outs
                else:
                    print(f"{setting} batch {batch}: greedy outputs identical to {first}: "
                          f"{agreement(outs, reference[batch])}")
        finally:
            llm.shutdown()
            # The next LLM sizes its KV pool from the free memory: this one's must be gone.
            del llm
            release_memory()
    if a.transformers:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(a.device or "cpu")
        timed_transformers(hf, prompts[:2], 4)  # warm-up
        for batch in a.batch:
            best = min(timed_transformers(hf, prompts[:batch], 1 + a.decode)
                       - timed_transformers(hf, prompts[:batch], 1) for _ in range(a.rounds))
            add(("-", "transformers", "-", batch, batch * a.decode / best, best / a.decode * 1e3))
        del hf
        release_memory()
    print(f"{'TP':>3} {'graph':>12} {'kernels':>8} {'batch':>6} {'decode tok/s':>13} "
          f"{'ms/step':>8}")
    for tp, graph, kernels, batch, rate, ms in rows:
        print(f"{tp:>3} {graph:>12} {kernels:>8} {batch:>6} {rate:>13.1f} {ms:>8.2f}")

if __name__ == "__main__":
    main()
