"""第 9 章：Radix Cache。请求算完的 token 连同它们的 KV 位置插进一棵基数树，后来的请求只要
前缀相同，就直接复用这些页，不再计算。

一、共享前缀：5 个请求同时到达，共用一段很长的系统提示词。radix 下调度器先只放行第 1 个，
    其余 4 个等一步，等它的前缀进了树再直接复用。分别用 radix 和 naive（什么都不缓存）各跑
    一遍，比较 prefill 实际算了多少 token。
二、内存紧张时淘汰：KV 池只有 20 页，8 个请求依次到达，没被锁住的前缀按最久未用先淘汰。
两种情况下每个请求的输出都要与 transformers 单独运行一致，结束后每一页都有着落。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
SYSTEM = ("You are a careful assistant. Answer in one short sentence, use plain words, and "
          "never invent facts you are unsure about. If a question has no clear answer, say so "
          "and explain what is missing. Question: ")
QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?",
             "What colour is the sky?", "Who wrote Hamlet?", "What is two plus two?"]
OTHERS = ["The quick brown fox jumps over", "Once upon a time in a land far away",
          "import numpy as np\nimport torch\n", "List three prime numbers and explain why",
          "Water boils at one hundred degrees", "My favourite book is about a hobbit",
          "def fibonacci(n):\n    if n < 2:", "The largest planet in our solar system"]
MAX_TOKENS = 8


def run(scheduler: Scheduler, prompts: list[list[int]], one_by_one: int) -> dict[int, list[int]]:
    """前 one_by_one 个请求逐个到达（每个先跑一步 prefill），其余的一起到达。"""
    outputs: dict[int, list[int]] = {uid: [] for uid in range(len(prompts))}
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for uid, ids in enumerate(prompts):
        scheduler.add_request(uid, ids, params)
        if uid < one_by_one:
            for r in scheduler.step():
                outputs[r.uid].append(r.token)
    while scheduler.has_work:
        for r in scheduler.step():
            outputs[r.uid].append(r.token)
        scheduler.cache.check_integrity(scheduler.decode.running)
    return outputs


def main() -> int:
    name = "SmolLM2-135M-Instruct"
    path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def matches_hf(outputs: dict[int, list[int]], prompts: list[list[int]]) -> bool:
        return all(outputs[uid] == hf.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)), max_new_tokens=MAX_TOKENS,
            eos_token_id=None, do_sample=False)[0, len(ids) :].tolist()
            for uid, ids in enumerate(prompts))

    failed = False
    shared = [tokenizer(SYSTEM + q).input_ids for q in QUESTIONS]
    print(f"一、共享前缀：系统提示词 {len(tokenizer(SYSTEM).input_ids)} 个 token，"
          f"5 个请求共 {sum(map(len, shared))} 个提示词 token（page_size=4）")
    results = {}
    for cache_type in ["naive", "radix"]:
        scheduler = Scheduler(SchedulerConfig(str(path), max_running_req=8, page_size=4,
                                              num_page_override=256, max_seq_len_override=256,
                                              cache_type=cache_type))
        results[cache_type] = run(scheduler, shared, one_by_one=0)
        cache = scheduler.cache
        print(f"  {cache_type:5s}: prefill 实际计算 {scheduler.prefill_computed_tokens:3d} 个 "
              f"token，命中缓存 {cache.hit_tokens:3d} 个；结束后 空闲 "
              f"{len(cache.free_pages)} 页 + 树中可淘汰 "
              f"{cache.prefix_cache.evictable_size // 4} 页 = {cache.available_pages} 页")
        failed |= cache.available_pages != 256
    same = results["naive"] == results["radix"]
    hf_ok = matches_hf(results["radix"], shared)
    print(f"  radix 与 naive 输出相同: {same}，与 HF 单独运行一致: {hf_ok}")
    failed |= not (same and hf_ok)

    others = [tokenizer(p).input_ids for p in OTHERS]
    scheduler = Scheduler(SchedulerConfig(str(path), max_running_req=4, page_size=4,
                                          num_page_override=20, max_seq_len_override=80))
    outputs = run(scheduler, others, one_by_one=len(others))
    cache = scheduler.cache
    hf_ok = matches_hf(outputs, others)
    print(f"二、淘汰：KV 池 20 页，8 个请求依次到达；淘汰了 {cache.evicted_pages} 页，"
          f"树里还剩 {cache.prefix_cache.evictable_size // 4} 页，空闲 {len(cache.free_pages)} 页")
    print(f"  每个请求与 HF 单独运行一致: {hf_ok}；"
          f"{'每一页都有着落' if cache.available_pages == 20 else '有页丢失！'}")
    failed |= not hf_ok or cache.evicted_pages == 0 or cache.available_pages != 20
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
