"""What decode attention costs inside a whole decode step, without a profiler.

Under torch.profiler (decode_profile.py) chapter 19's decode attention can look slower inside a
step than alone (decode_attention.py --graph, back to back in a graph), but the
two differ in more than the neighbours: the profiler, and the contexts (the step's grow by a
token a step past the prompt). Here one engine is built twice: as it is, and with every layer's
attention taken out of the captured decode graphs (the backend's forward returns the queries;
the plan kernel stays). Each decodes a few steps, then its graph for the batch is replayed back
to back between CUDA events, on the static buffers the last step left (the same rows and
positions every time): the GPU's time for the step's forward, no host, no profiler. The
difference over the layers is what a layer's attention costs inside the step; next to it, the
kernel alone on the same contexts, as decode_attention.py times it.

    python benchmark/gpu/attention_share.py [--batch 256] [--prompt-len 700]

One batch a process (benchmark/gpu/run.sh's `profile` runs three), each engine with a pool of
its own size: a later engine of a process, sized by free memory, would find less of it than the
first.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark"), str(ROOT / "benchmark/gpu")]
from decode_attention import ours_microseconds  # noqa: E402
from decode_profile import decoding  # noqa: E402
from minisgl.attention.custom_decode import (CustomDecodeAttention,  # noqa: E402
                                             CustomDecodeMetadata)
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


def graph_ms(model: str, batch: int, prompt_len: int, replays: int,
             attention: bool) -> tuple[float, list[int]]:
    """GPU ms per replay of the decode graph for `batch`, and the contexts it attends to."""
    backend = CustomDecodeAttention
    forward = backend.forward
    if not attention:  # in place before the graphs are captured; prefill keeps its attention
        def no_decode_attention(self, q, k, v, layer_id, batch_):  # type: ignore[no-untyped-def]
            if isinstance(batch_.attn_metadata, CustomDecodeMetadata):
                return q
            return forward(self, q, k, v, layer_id, batch_)
        backend.forward = no_decode_attention  # type: ignore[method-assign]
    try:
        # A fixed pool, as large as the batch needs: sized by free memory, the second engine of
        # a process would get what the first left, and fewer requests would fit.
        llm = LLM(model, dtype=torch.bfloat16, max_running_req=batch, page_size=256,
                  max_seq_len_override=prompt_len + 512, device="cuda",
                  num_page_override=batch * -(-(prompt_len + 512) // 256))
    finally:
        backend.forward = forward  # type: ignore[method-assign]
    scheduler = llm.backend.scheduler  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(0)
    for uid in range(batch):
        scheduler.add_request(uid, torch.randint(0, 10000, (prompt_len,), generator=gen),
                              SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.6))
    while not decoding(scheduler):
        scheduler.step()
    for _ in range(5):
        scheduler.step()
    contexts = [r.device_len for r in scheduler.in_flight.batch.reqs]  # type: ignore[union-attr]
    # A pool too small for the batch would run fewer requests than asked: say so, rather
    # than time another batch size.
    if len(contexts) != batch:
        raise RuntimeError(f"{len(contexts)} requests in flight, not {batch}")
    torch.cuda.synchronize()
    graph = scheduler.engine.graphs.graphs[batch]  # type: ignore[union-attr]
    with torch.cuda.stream(scheduler.engine.stream):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
    torch.cuda.synchronize()
    gpu = start.elapsed_time(end) / replays
    del scheduler
    llm.shutdown()
    gc.collect()
    torch.cuda.empty_cache()
    return gpu, contexts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/qwen3-0.6b-random")
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--prompt-len", type=int, default=700)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--no-header", dest="header", action="store_false",
                        help="rows only: for the processes after the first")
    args = parser.parse_args()
    if args.header:
        print(f"{torch.cuda.get_device_name()}；每个请求 {args.prompt_len} 个 token 的提示词，"
              f"page_size 256；decode 图背靠背回放 {args.replays} 次的 GPU 时间（毫秒/步，微秒/层）")
        print(f"{'batch':>6}{'上下文':>9}{'整步':>9}{'去掉注意力':>12}{'差/层 µs':>10}"
              f"{'单独 µs':>9}{'差/单独':>9}")
    for batch in args.batch:
        with_attention, contexts = graph_ms(args.model, batch, args.prompt_len, args.replays, True)
        without, _ = graph_ms(args.model, batch, args.prompt_len, args.replays, False)
        in_step = (with_attention - without) * 1e3 / args.layers
        alone, _ = ours_microseconds(contexts, 256, 16, 64)
        mean = sum(contexts) / len(contexts)
        print(f"{batch:>6}{mean:>9.0f}{with_attention:>9.3f}{without:>12.3f}{in_step:>10.1f}"
              f"{alone:>9.1f}{in_step / alone:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
