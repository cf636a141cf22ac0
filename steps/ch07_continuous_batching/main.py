"""第 7 章：连续批处理。调度器接管阶段一里手工填 batch 的那几行：新请求先 prefill，之后每一步
所有在跑的请求各 decode 一个 token；请求随时加入、各自在 max_tokens 用完时离开，其余请求不受
影响。每一步打印 batch 里有谁；最后每个请求的输出都要等于 transformers 单独跑它的结果。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

MODELS = Path("models")  # run from the repository root, or from a tree built by tools/steps.py build
# (到达的步数, 提示词, max_tokens)：长短不一，所以离开的时间也不一样
ARRIVALS = [(0, "The capital of France is", 12), (0, "List three prime numbers:", 6),
            (0, "def fibonacci(n):", 9), (3, "The quick brown fox", 5),
            (5, "In a hole in the ground there lived a hobbit.", 8), (12, "Once upon a time", 4)]


def hf_greedy(hf, prompt_ids: list[int], max_tokens: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                      eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def main() -> int:
    failed = False
    for name in ["SmolLM2-135M-Instruct", "tiny-qwen3"]:
        path, tokenizer = MODELS / name, AutoTokenizer.from_pretrained(MODELS / name)
        scheduler = Scheduler(SchedulerConfig(str(path), max_running_req=4, page_size=4,
                                              num_page_override=128, max_seq_len_override=128))
        outputs: dict[int, list[int]] = {uid: [] for uid in range(len(ARRIVALS))}
        print(f"[{name}] 最多 4 个请求同时在跑；6 个请求在不同的步到达")
        step = 0
        while step == 0 or scheduler.has_work or any(s >= step for s, _, _ in ARRIVALS):
            for uid, (arrive, prompt, max_tokens) in enumerate(ARRIVALS):
                if arrive == step:
                    scheduler.add_request(uid, tokenizer(prompt).input_ids,
                                          SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            results = scheduler.step()
            for r in results:
                outputs[r.uid].append(r.token)
            finished = [r.uid for r in results if r.finished]
            # prefill 为每个请求产出它的第 1 个 token，decode 产出之后的 token
            first = all(len(outputs[r.uid]) == 1 for r in results)
            phase = "prefill" if first else "decode "
            print(f"  第 {step:2d} 步 {phase} 请求 {[r.uid for r in results]}"
                  + (f"  完成 {finished}" if finished else ""))
            step += 1

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        for uid, (_, prompt, max_tokens) in enumerate(ARRIVALS):
            ok = outputs[uid] == hf_greedy(hf, tokenizer(prompt).input_ids, max_tokens)
            print(f"  请求 {uid}（{max_tokens} 个 token）{tokenizer.decode(outputs[uid])!r}  "
                  f"与 HF 单独运行一致: {ok}")
            failed |= not ok
        free = len(scheduler.cache.free_pages)
        print(f"  全部完成后：空闲页 {free}/{scheduler.engine.num_pages}，"
              f"空闲行 {scheduler.table.available}/4")
        failed |= free != scheduler.engine.num_pages or scheduler.table.available != 4
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
