"""第 8 章：准入控制。KV 池故意开得很小：10 个请求一起到达，但同时只装得下两三个。PrefillAdder
只在空闲页足够覆盖"在跑请求还要的页 + 新请求一生要用的页"时才放行，放不下的按顺序排队。
每一步打印放行了谁、还有几个在等、空闲页和预留页；最后核对：每个请求恰好生成 max_tokens 个
token、与 transformers 单独运行一致、没有请求丢失或重复，页和行全部归还。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):",
           "The quick brown fox", "Once upon a time", "My favourite colour is",
           "Water boils at", "The largest planet is", "import numpy as np", "Dear Sir or Madam,"]
MAX_TOKENS = [12, 7, 15, 9, 11, 5, 13, 8, 10, 6]
NUM_PAGES, PAGE_SIZE = 16, 4  # 整个 KV 池只有 64 个 token 的位置


def main() -> int:
    name = "SmolLM2-135M-Instruct"
    path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
    scheduler = Scheduler(SchedulerConfig(str(path), max_running_req=8, page_size=PAGE_SIZE,
                                          num_page_override=NUM_PAGES, max_seq_len_override=64))
    prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
    for uid, (ids, n) in enumerate(zip(prompt_ids, MAX_TOKENS)):
        scheduler.add_request(uid, ids, SamplingParams(max_tokens=n, ignore_eos=True))
    print(f"[{name}] KV 池 {NUM_PAGES} 页 × {PAGE_SIZE} token；10 个请求同时到达，"
          f"page table 有 8 行")

    outputs: dict[int, list[int]] = {uid: [] for uid in range(len(PROMPTS))}
    finished_order, step = [], 0
    while scheduler.has_work:
        results = scheduler.step()
        for r in results:
            outputs[r.uid].append(r.token)
            finished_order += [r.uid] if r.finished else []
        admitted = [r.uid for r in results if len(outputs[r.uid]) == 1]
        print(f"  第 {step:2d} 步 {'prefill 放行 ' + str(admitted) if admitted else 'decode ' + str([r.uid for r in results])}"
              f"；等待 {len(scheduler.prefill.pending)}，空闲页 {len(scheduler.cache.free_pages)}，"
              f"在跑请求还要 {scheduler.decode.reserved_pages} 页")
        step += 1

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    failed = sorted(finished_order) != list(range(len(PROMPTS)))  # 每个请求恰好完成一次
    for uid, (ids, n) in enumerate(zip(prompt_ids, MAX_TOKENS)):
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                          max_new_tokens=n, eos_token_id=None, do_sample=False)[0, len(ids) :]
        ok = outputs[uid] == ref.tolist() and len(outputs[uid]) == n
        failed |= not ok
        print(f"  请求 {uid}: {len(outputs[uid])}/{n} 个 token，与 HF 单独运行一致: {ok}")
    print(f"  完成顺序 {finished_order}；空闲页 {len(scheduler.cache.free_pages)}/{NUM_PAGES}，"
          f"空闲行 {scheduler.table.available}/8")
    failed |= len(scheduler.cache.free_pages) != NUM_PAGES or scheduler.table.available != 8
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
